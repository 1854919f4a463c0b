//! Cancelling a blocked wait from another thread: a [`CancelToken`], and the
//! [`WaitOptions`] that carry it (with an optional time limit) into every blocking wait.
//!
//! A token is a tokio-util `CancellationToken` (the flag, and the wake-up of the waits that
//! run on the client's runtime) plus a [`Signal`] (a channel that disconnects) for user
//! threads in a `select!`. Cancelling is a store and two wake-ups, with no I/O, so it is
//! cheap enough for a signal-handling thread.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use tokio_util::sync::CancellationToken;

use crate::support::error::{Error, Result};
use crate::support::signal::Signal;

/// A handle that cancels the waits it was given to, from any thread.
///
/// Pass it to a wait through [`WaitOptions`] (`mutex.lock_with(&token)`,
/// `election.campaign_with(value, &token)`, ...). [`cancel`](CancelToken::cancel) makes
/// every such wait, current or later, return [`Error::Cancelled`] within about one request
/// round trip, and leave no key behind. Clones share one state: cancelling any clone
/// cancels them all. A token cannot be reset; make a new one for the next wait.
///
/// ```no_run
/// use etcd_sync::CancelToken;
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let token = CancelToken::new();
/// let stopper = token.clone();
/// // e.g. from a thread that waits for SIGTERM:
/// std::thread::spawn(move || stopper.cancel());
/// match session.mutex("nightly")?.lock_with(&token) {
///     Ok(_guard) => println!("running the nightly job"),
///     Err(e) if e.is_cancelled() => println!("shutting down before we got the lock"),
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct CancelToken {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The flag; wakes the waits running on a client runtime.
    token: CancellationToken,
    /// Fired once, by the first `cancel`; wakes user threads selecting on [`CancelToken::cancelled`].
    signal: SignalCell,
}

/// A [`Signal`] made on first use, so that `CancelToken::new()` allocates no channel.
#[derive(Default)]
struct SignalCell(std::sync::OnceLock<Signal>);

impl SignalCell {
    fn get(&self) -> &Signal {
        self.0.get_or_init(Signal::new)
    }
}

impl CancelToken {
    /// A token that is not cancelled.
    ///
    /// ```
    /// let token = etcd_sync::CancelToken::new();
    /// assert!(!token.is_cancelled());
    /// ```
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// Cancels every wait given this token (or a clone of it), now and later. Returns
    /// whether this call was the one that cancelled it. Never blocks.
    ///
    /// ```
    /// let token = etcd_sync::CancelToken::new();
    /// assert!(token.cancel());
    /// assert!(!token.clone().cancel()); // already cancelled
    /// assert!(token.is_cancelled());
    /// ```
    pub fn cancel(&self) -> bool {
        // The flag first, so whoever the signal wakes sees `is_cancelled()`; the signal
        // fires once, which tells the first call from the others.
        self.inner.token.cancel();
        self.inner.signal.get().fire()
    }

    /// Whether [`cancel`](CancelToken::cancel) was called on this token or a clone.
    ///
    /// ```
    /// let token = etcd_sync::CancelToken::new();
    /// assert!(!token.is_cancelled());
    /// ```
    pub fn is_cancelled(&self) -> bool {
        self.inner.token.is_cancelled()
    }

    /// A receiver that becomes ready (disconnected) when the token is cancelled, for a
    /// [`select!`](crossbeam_channel::select) beside a guard's `lost()` and your own
    /// channels.
    ///
    /// ```no_run
    /// use etcd_sync::crossbeam_channel::select;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let token = etcd_sync::CancelToken::new();
    /// let guard = session.mutex("shard-3")?.lock_with(&token)?;
    /// select! {
    ///     recv(guard.lost()) -> _ => eprintln!("lost the shard"),
    ///     recv(token.cancelled()) -> _ => println!("asked to stop"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn cancelled(&self) -> Receiver<()> {
        self.inner.signal.get().receiver()
    }

    /// A token cancelled with this one, or on its own (its cancel does not reach this
    /// one).
    pub(crate) fn child(&self) -> CancelToken {
        CancelToken {
            inner: Arc::new(Inner {
                token: self.inner.token.child_token(),
                signal: SignalCell::default(),
            }),
        }
    }

    /// The flag, for what must cancel this token without a `CancelToken` in hand.
    pub(crate) fn cancellation(&self) -> CancellationToken {
        self.inner.token.clone()
    }

    /// Resolves when the token is cancelled (at once if it already is).
    pub(crate) async fn wait(&self) {
        self.inner.token.cancelled().await;
    }

    /// `Err(Cancelled)` once cancelled.
    pub(crate) fn check(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(Error::Cancelled)
        } else {
            Ok(())
        }
    }
}

impl std::fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelToken")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

/// How long a blocking wait may last, and what may cancel it: what the `*_with` waits
/// (`Mutex::lock_with`, `Election::campaign_with`, `RwLock::read_with`/`write_with`,
/// `Semaphore::acquire_with`, `Observer::recv_with`, `Barrier::wait_with`,
/// `DoubleBarrier::enter_with`/`leave_with`, `CountDownLatch::wait_with`) take.
///
/// A `&CancelToken` or a `Duration` converts into one, so the common cases stay short:
/// `mutex.lock_with(&token)`, `mutex.lock_with(Duration::from_secs(5))`.
///
/// ```no_run
/// use std::time::Duration;
/// use etcd_sync::{CancelToken, WaitOptions};
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let token = CancelToken::new();
/// let options = WaitOptions::new().timeout(Duration::from_secs(30)).cancel_token(&token);
/// match session.mutex("reindex")?.lock_with(options) {
///     Ok(_guard) => println!("reindexing"),
///     Err(e) if e.is_wait_timeout() => println!("busy for 30 s: try later"),
///     Err(e) if e.is_cancelled() => println!("cancelled"),
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct WaitOptions {
    timeout: Option<Duration>,
    cancel: Option<CancelToken>,
}

impl WaitOptions {
    /// Wait without a limit and without a token (the same as `lock()`).
    ///
    /// ```
    /// let options = etcd_sync::WaitOptions::new();
    /// assert_eq!(options.timeout_value(), None);
    /// ```
    pub fn new() -> WaitOptions {
        WaitOptions::default()
    }

    /// Give up after `timeout` with a wait timeout
    /// ([`Error::is_wait_timeout`](crate::Error::is_wait_timeout)). A timeout too large
    /// to represent as an instant means no limit.
    ///
    /// ```
    /// use std::time::Duration;
    /// let options = etcd_sync::WaitOptions::new().timeout(Duration::from_secs(5));
    /// assert_eq!(options.timeout_value(), Some(Duration::from_secs(5)));
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> WaitOptions {
        self.timeout = Some(timeout);
        self
    }

    /// Give up with [`Error::Cancelled`] when `token` (or a clone) is cancelled.
    ///
    /// ```
    /// let token = etcd_sync::CancelToken::new();
    /// let options = etcd_sync::WaitOptions::new().cancel_token(&token);
    /// assert!(options.cancel_token_value().is_some());
    /// ```
    pub fn cancel_token(mut self, token: &CancelToken) -> WaitOptions {
        self.cancel = Some(token.clone());
        self
    }

    /// The time limit set with [`timeout`](WaitOptions::timeout), if any.
    ///
    /// ```
    /// assert_eq!(etcd_sync::WaitOptions::new().timeout_value(), None);
    /// ```
    pub fn timeout_value(&self) -> Option<Duration> {
        self.timeout
    }

    /// The token set with [`cancel_token`](WaitOptions::cancel_token), if any.
    ///
    /// ```
    /// assert!(etcd_sync::WaitOptions::new().cancel_token_value().is_none());
    /// ```
    pub fn cancel_token_value(&self) -> Option<&CancelToken> {
        self.cancel.as_ref()
    }
}

impl From<&CancelToken> for WaitOptions {
    fn from(token: &CancelToken) -> WaitOptions {
        WaitOptions::new().cancel_token(token)
    }
}

impl From<Duration> for WaitOptions {
    fn from(timeout: Duration) -> WaitOptions {
        WaitOptions::new().timeout(timeout)
    }
}

impl From<&WaitOptions> for WaitOptions {
    fn from(options: &WaitOptions) -> WaitOptions {
        options.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_wakes_a_runtime_wait_and_a_select() {
        let token = CancelToken::new();
        let rx = token.cancelled();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let t2 = token.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            t2.cancel();
        });
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), token.wait())
                .await
                .expect("cancel woke the wait");
        });
        assert!(matches!(
            rx.recv_timeout(Duration::from_secs(5)),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        ));
        // A wait that starts after the cancel ends at once.
        rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(10), token.wait())
                .await
                .expect("already cancelled");
        });
        assert!(matches!(token.check(), Err(Error::Cancelled)));
    }

    #[test]
    fn options_convert_from_a_token_and_a_duration() {
        let token = CancelToken::new();
        let o: WaitOptions = (&token).into();
        assert!(o.cancel_token_value().is_some() && o.timeout_value().is_none());
        let o: WaitOptions = Duration::from_secs(1).into();
        assert_eq!(o.timeout_value(), Some(Duration::from_secs(1)));
        assert!(format!("{token:?}").contains("cancelled: false"));
    }
}
