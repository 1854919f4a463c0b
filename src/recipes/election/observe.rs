//! Watching an election without taking part: every change of its leader as it happens
//! ([`Observer`], [`Client::observe`]). Needs no session. Who leads now is the
//! [`Status`](crate::Status) read (`Client::leader`, in `recipes/status.rs`).

use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use crate::client::Client;
use crate::line::queue;
use crate::recipes::holder::Holder;
use crate::support::backoff::Backoff;
use crate::support::cancel::WaitOptions;
use crate::support::error::operation::Operation;
use crate::support::error::{Error, Result};
use crate::transport::Rpc;
use crate::transport::watch::{EventKind, Only};
use crate::transport::watches::{Delivery, Spec, Watches};

/// A change seen by an [`Observer`].
///
/// ```
/// use etcd_sync::LeaderEvent;
/// fn describe(e: &LeaderEvent) -> String {
///     match e {
///         LeaderEvent::Elected(l) => format!("new leader {}", l.value_str()),
///         LeaderEvent::Proclaimed(l) => format!("leader says {}", l.value_str()),
///         LeaderEvent::NoLeader => "no leader".into(),
///     }
/// }
/// assert_eq!(describe(&LeaderEvent::NoLeader), "no leader");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderEvent {
    /// A (new) leader: the first event when there is one, then every leader change. Its
    /// [`ttl`](Holder::ttl) is `None`: no lease is looked up.
    Elected(Holder),
    /// The same leader proclaimed a new value (see [`Holder::mod_revision`]).
    Proclaimed(Holder),
    /// Nobody leads (the first event when the election is empty, or after the last
    /// candidate left).
    NoLeader,
}

impl Client {
    /// Follows election `name` without a session (no lease is granted): same as
    /// [`Election::observe`](crate::Election::observe).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `name` is empty, ends with `/` or is longer than 4096 bytes,
    /// [`Error::InsideAsyncRuntime`] on an async worker thread. Nothing is sent before this
    /// returns: etcd's errors arrive through the [`Observer`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let observer = client.observe("scheduler")?;
    /// println!("{:?}", observer.recv()?);
    /// # Ok(()) }
    /// ```
    pub fn observe(&self, name: impl AsRef<[u8]>) -> Result<Observer> {
        observe_prefix(self.clone(), queue::key_prefix(name.as_ref())?)
    }
}

/// Starts the observer task for `prefix` on the client's runtime.
pub(crate) fn observe_prefix(client: crate::client::Client, prefix: Vec<u8>) -> Result<Observer> {
    crate::client::runtime::ensure_blocking_allowed()?;
    let (events_tx, events) = crossbeam_channel::bounded(OBSERVER_BUFFER);
    let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
    let rpc = client.rpc().clone();
    let watches = client.watches().clone();
    client.spawn(async move {
        tokio::select! {
            _ = cancelled => {}
            _ = observe_loop(rpc, watches, prefix, events_tx) => {}
        }
    });
    Ok(Observer {
        events,
        _cancel: cancel,
        _client: client,
    })
}

/// Reads the oldest key under `prefix` (linearizable) and the revision of the read. No
/// lease is looked up: the observer's holders have no TTL.
async fn current_leader(rpc: &Rpc, prefix: &[u8]) -> Result<(Option<Holder>, i64)> {
    let read = rpc.read(&queue::first_created(prefix)).await?;
    let leader = read.kvs.into_iter().next();
    Ok((leader.map(|kv| Holder::of(prefix, kv, None)), read.revision))
}

/// How many events an [`Observer`] buffers for a consumer that does not keep up. Past
/// that, changes are coalesced: when room frees up, one event takes the consumer from what
/// it saw last to the current state, so memory stays bounded and nothing current is lost.
pub(crate) const OBSERVER_BUFFER: usize = 256;

/// How often a consumer that fell behind is offered the latest state again.
const BEHIND_RETRY: Duration = Duration::from_millis(250);

/// The observer's side of the channel: remembers what the consumer saw last, and
/// coalesces while the buffer is full.
struct Outbox {
    events: Sender<Result<LeaderEvent>>,
    delivered: Option<Option<Holder>>,
    behind: bool,
}

impl Outbox {
    /// Offers `event`, the transition to `now`; false once the observer is dropped.
    fn offer(&mut self, event: LeaderEvent, now: &Option<Holder>) -> bool {
        if self.behind {
            return self.catch_up(now);
        }
        match self.events.try_send(Ok(event)) {
            Ok(()) => {
                self.delivered = Some(now.clone());
                true
            }
            Err(crossbeam_channel::TrySendError::Full(_)) => {
                self.behind = true;
                true
            }
            Err(crossbeam_channel::TrySendError::Disconnected(_)) => false,
        }
    }

    /// Once the consumer has room again: one event from what it saw last to `now`.
    fn catch_up(&mut self, now: &Option<Holder>) -> bool {
        if self.events.is_full() {
            // Still no room. (A dropped Observer cancels this task: no need to check.)
            return true;
        }
        self.behind = false;
        match diff(self.delivered.as_ref(), now) {
            Some(event) => self.offer(event, now),
            None => true,
        }
    }

    /// A final error (never blocks: if the buffer is full it is dropped, and the consumer
    /// sees the observer closed after draining).
    fn fail(&self, error: Error) {
        let _ = self.events.try_send(Err(error));
    }
}

/// The observer task: subscribe to every change under the prefix (on the client's one
/// watch stream), read the leader whenever the subscription starts after what we know or
/// leadership may have changed, and emit only differences.
async fn observe_loop(
    rpc: Rpc,
    watches: Watches,
    prefix: Vec<u8>,
    events: Sender<Result<LeaderEvent>>,
) {
    let mut last: Option<Option<Holder>> = None;
    // Revision of our last read: events at or before it are already reflected in `last`.
    let mut read_at = 0i64;
    let mut backoff = Backoff::quick();
    let mut outbox = Outbox {
        events,
        delivered: None,
        behind: false,
    };
    let mut changes = watches.subscribe(Spec::prefix(&prefix, Only::All), 0);
    let mut reread = false;
    loop {
        if reread {
            match current_leader(&rpc, &prefix).await {
                Ok((current, at)) => {
                    backoff.reset();
                    read_at = at;
                    reread = false;
                    if let Some(event) = diff(last.as_ref(), &current) {
                        tracing::debug!(?event, "leadership changed");
                        if !outbox.offer(event, &current) {
                            return;
                        }
                    }
                    last = Some(current);
                }
                Err(e) if e.is_transient() => {
                    backoff.sleep().await;
                    continue;
                }
                Err(e) => {
                    outbox.fail(e);
                    return;
                }
            }
        }
        let delivery = tokio::select! {
            delivery = changes.next() => Some(delivery),
            // A consumer that was behind may have room again.
            _ = tokio::time::sleep(BEHIND_RETRY), if outbox.behind => None,
        };
        if outbox.behind && !outbox.catch_up(last.as_ref().unwrap_or(&None)) {
            return;
        }
        match delivery {
            None => {}
            Some(Delivery::From { after, .. }) if last.is_none() || after > read_at => {
                reread = true;
            }
            Some(Delivery::From { .. }) => {}
            Some(Delivery::Events(batch)) => {
                for event in batch.iter().filter(|e| e.kv.mod_revision > read_at) {
                    let kv = &event.kv;
                    let is_put = event.kind == EventKind::Put;
                    match last.as_ref().and_then(Option::as_ref) {
                        // A new value under the leader's own key (same create revision):
                        // the same leader proclaimed. Reported from the event: no read.
                        Some(l)
                            if is_put
                                && kv.key == l.key
                                && kv.create_revision == l.create_revision
                                && kv.mod_revision > l.mod_revision =>
                        {
                            let proclaimed = Holder::of(&prefix, kv.clone(), None);
                            let now = Some(proclaimed.clone());
                            if !outbox.offer(LeaderEvent::Proclaimed(proclaimed), &now) {
                                return;
                            }
                            last = Some(now);
                        }
                        // The leader's key went away: someone else (or nobody) leads now.
                        Some(l) if !is_put && kv.key == l.key => reread = true,
                        // A candidate joined an empty election.
                        None if is_put => reread = true,
                        _ => {}
                    }
                }
            }
            Some(Delivery::Failed(e)) => {
                outbox.fail(e);
                return;
            }
        }
    }
}

/// The event that takes an observer from `last` to `current`, if anything changed.
fn diff(last: Option<&Option<Holder>>, current: &Option<Holder>) -> Option<LeaderEvent> {
    match (last, current) {
        (Some(None), None) => None,
        (_, None) => Some(LeaderEvent::NoLeader),
        (Some(Some(prev)), Some(now))
            if prev.key == now.key && prev.create_revision == now.create_revision =>
        {
            (prev.mod_revision != now.mod_revision).then(|| LeaderEvent::Proclaimed(now.clone()))
        }
        (_, Some(now)) => Some(LeaderEvent::Elected(now.clone())),
    }
}

/// A blocking stream of leadership changes from [`Election::observe`](crate::Election::observe). Iterate it, or use
/// [`recv`](Observer::recv) / [`recv_timeout`](Observer::recv_timeout). Dropping it stops
/// the watch.
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let observer = session.election("scheduler")?.observe()?;
/// loop {
///     match observer.recv_timeout(std::time::Duration::from_secs(5)) {
///         Ok(event) => println!("{event:?}"),
///         Err(e) if e.is_wait_timeout() => break, // quiet for 5 s
///         Err(e) => return Err(e),
///     }
/// }
/// # Ok(()) }
/// ```
pub struct Observer {
    events: Receiver<Result<LeaderEvent>>,
    _cancel: tokio::sync::oneshot::Sender<()>,
    // Keeps the runtime that runs the observer task alive.
    _client: crate::client::Client,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

impl Observer {
    /// Blocks until the next change.
    ///
    /// # Errors
    ///
    /// * The error that stopped the observer, once: etcd refused the watch or the read of
    ///   the leader ([`Error::Server`], e.g. `PermissionDenied`; [`Error::Unavailable`]
    ///   when etcd cancelled the watch for another reason), or re-authenticating failed
    ///   ([`Error::Authentication`]). Unreachable members, broken streams and compaction
    ///   are not errors: the observer retries and re-reads by itself.
    /// * [`Error::Closed`]: the observer has stopped (every call after that error).
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let observer = session.election("e")?.observe()?;
    /// let first = observer.recv()?; // the current state
    /// # let _ = first;
    /// # Ok(()) }
    /// ```
    pub fn recv(&self) -> Result<LeaderEvent> {
        crate::client::runtime::ensure_blocking_allowed()?;
        self.events.recv().map_err(|_| Error::Closed)?
    }

    /// Waits up to `timeout` for the next change. A limit that runs out is an error, as for
    /// every wait of this crate (the rule is in [`Error::is_wait_timeout`]) and as for
    /// std's [`Receiver::recv_timeout`](std::sync::mpsc::Receiver::recv_timeout).
    ///
    /// # Errors
    ///
    /// * [`Error::Timeout`] with [`Operation::Observe`] and `after: timeout`
    ///   ([`is_wait_timeout`](Error::is_wait_timeout)): no change came within `timeout`;
    ///   the observer goes on.
    /// * The error that stopped the observer, once: etcd refused the watch or the read of
    ///   the leader ([`Error::Server`], e.g. `PermissionDenied`; [`Error::Unavailable`]
    ///   when etcd cancelled the watch for another reason), or re-authenticating failed
    ///   ([`Error::Authentication`]). Unreachable members, broken streams and compaction
    ///   are not errors: the observer retries and re-reads by itself.
    /// * [`Error::Closed`]: the observer has stopped (every call after that error).
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let observer = session.election("e")?.observe()?;
    /// match observer.recv_timeout(std::time::Duration::from_millis(100)) {
    ///     Ok(event) => println!("{event:?}"),
    ///     Err(e) if e.is_wait_timeout() => println!("no change in 100 ms"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn recv_timeout(&self, timeout: Duration) -> Result<LeaderEvent> {
        crate::client::runtime::ensure_blocking_allowed()?;
        match self.events.recv_timeout(timeout) {
            Ok(event) => event,
            Err(RecvTimeoutError::Timeout) => Err(Error::wait_timeout(Operation::Observe, timeout)),
            Err(RecvTimeoutError::Disconnected) => Err(Error::Closed),
        }
    }

    /// Waits for the next change under a time limit and/or a
    /// [`CancelToken`](crate::CancelToken) (see [`WaitOptions`]), like
    /// [`Mutex::lock_with`](crate::Mutex::lock_with): whichever of the change, the limit
    /// and the token comes first ends the wait.
    ///
    /// # Errors
    ///
    /// * [`Error::Timeout`] with [`Operation::Observe`]
    ///   ([`is_wait_timeout`](Error::is_wait_timeout)): the limit passed first.
    /// * [`Error::Cancelled`]: the token was cancelled first (or before the call).
    /// * Otherwise as [`recv`](Observer::recv).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let observer = client.observe("scheduler")?;
    /// let token = etcd_sync::CancelToken::new();
    /// loop {
    ///     match observer.recv_with(&token) {
    ///         Ok(event) => println!("{event:?}"),
    ///         Err(e) if e.is_cancelled() => break,
    ///         Err(e) => return Err(e),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn recv_with(&self, options: impl Into<WaitOptions>) -> Result<LeaderEvent> {
        crate::client::runtime::ensure_blocking_allowed()?;
        let options = options.into();
        let cancelled = match options.cancel_token_value() {
            Some(token) => {
                token.check()?;
                token.cancelled()
            }
            None => crossbeam_channel::never(),
        };
        // Without a limit `expired` never fires, and `after` is not used.
        let (expired, after) = match options.timeout_value() {
            Some(limit) => (crossbeam_channel::after(limit), limit),
            None => (crossbeam_channel::never(), Duration::ZERO),
        };
        crossbeam_channel::select_biased! {
            recv(self.events) -> event => match event {
                Ok(event) => event,
                Err(_) => Err(Error::Closed),
            },
            recv(cancelled) -> _ => Err(Error::Cancelled),
            recv(expired) -> _ => Err(Error::wait_timeout(Operation::Observe, after)),
        }
    }

    /// The channel the changes arrive on, to wait for them in a
    /// [`select!`](crate::crossbeam_channel::select) beside a guard's `lost()` and your own
    /// channels. Each message is what [`recv`](Observer::recv) would return: `Ok(event)`,
    /// or a final `Err` after which the channel disconnects (as it does when the observer
    /// stops). Receiving from it is the same as calling `recv`: events are not duplicated.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// use etcd_sync::crossbeam_channel::{select, unbounded};
    /// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let session = client.session()?;
    /// let guard = session.mutex("shard-7")?.lock()?;
    /// let observer = client.observe("scheduler")?;
    /// let (_shutdown_tx, shutdown) = unbounded::<()>();
    /// loop {
    ///     select! {
    ///         recv(observer.receiver()) -> event => match event {
    ///             Ok(Ok(event)) => println!("scheduler: {event:?}"),
    ///             Ok(Err(e)) => return Err(e),
    ///             Err(_) => break, // the observer stopped
    ///         },
    ///         recv(guard.lost()) -> _ => {
    ///             eprintln!("lost shard-7: stop working on it");
    ///             break;
    ///         }
    ///         recv(shutdown) -> _ => break,
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn receiver(&self) -> &Receiver<Result<LeaderEvent>> {
        &self.events
    }

    /// The next change if one is ready, `Ok(None)` if none is, without blocking (also
    /// allowed on an async worker thread). It does not wait, so it has no limit to run out
    /// of: "nothing yet" is an answer here, where a wait that ran out is an error (see
    /// [`Error::is_wait_timeout`]).
    ///
    /// # Errors
    ///
    /// * The error that stopped the observer, once: etcd refused the watch or the read of
    ///   the leader ([`Error::Server`], e.g. `PermissionDenied`; [`Error::Unavailable`]
    ///   when etcd cancelled the watch for another reason), or re-authenticating failed
    ///   ([`Error::Authentication`]). Unreachable members, broken streams and compaction
    ///   are not errors: the observer retries and re-reads by itself.
    /// * [`Error::Closed`]: the observer has stopped (every call after that error).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let observer = session.election("e")?.observe()?;
    /// let _maybe = observer.try_recv()?;
    /// # Ok(()) }
    /// ```
    pub fn try_recv(&self) -> Result<Option<LeaderEvent>> {
        match self.events.try_recv() {
            Ok(event) => event.map(Some),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(Error::Closed),
        }
    }
}

impl Iterator for Observer {
    type Item = Result<LeaderEvent>;

    /// Blocks for the next change; ends (`None`) only when the observer stopped after an
    /// error it already yielded. Yields the errors of [`recv`](Observer::recv), except
    /// [`Error::Closed`] (the iterator ends instead); on an async worker thread, yields
    /// [`Error::InsideAsyncRuntime`].
    fn next(&mut self) -> Option<Self::Item> {
        if crate::client::runtime::inside_async() {
            return Some(Err(Error::InsideAsyncRuntime));
        }
        self.events.recv().ok()
    }
}
