//! The guard of a [`MultiLock`](crate::MultiLock): every key of the set, one "lost"
//! signal shared by their holds, and writes guarded by every key's compare in one Txn.

use std::sync::{Arc, OnceLock};

use crossbeam_channel::Receiver;

use crate::line::request::ReleaseRequest;
use crate::ownership::{self, Held, Released, RequestsStop};
use crate::support::error::{Error, Result};
use crate::support::kv::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, TxnResponse, text};

/// Releases every hold at once (see [`ownership::release_together`]), waiting as a
/// guard's `Drop` does: at most one request timeout, not at all inside an async runtime or
/// once the session is lost.
pub(super) fn release_all(mut held: Vec<Held>) {
    let wait = held.first().and_then(Held::drop_wait);
    let _ = ownership::release_together(&mut held, wait);
}

/// Proof that every lock of a [`MultiLock`](crate::MultiLock) is held; releases them all on
/// `Drop`, all at once (each key's release is a [`MutexGuard`](crate::MutexGuard)'s; `Drop`
/// waits at most one request timeout for them all).
///
/// The surface of a [`Guard`](crate::Guard), for every key at once: a fencing token per
/// name, [`is_held`](MultiLockGuard::is_held) (all held), [`lost`](MultiLockGuard::lost)
/// (fires at the first loss of any), and writes that commit only while *every* key is
/// still ours (one Txn comparing every key's create revision).
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let guard = session.multi_lock(["a", "b"])?.lock()?;
/// for (name, token) in guard.fencing_tokens() {
///     println!("{} held with token {token}", String::from_utf8_lossy(name));
/// }
/// crossbeam_channel::select! {
///     recv(guard.lost()) -> _ => eprintln!("lost one of them: stop now"),
///     default(std::time::Duration::from_secs(1)) => println!("did a second of work"),
/// }
/// guard.release()?;
/// # Ok(()) }
/// ```
#[must_use = "the guard releases as soon as it is dropped"]
pub struct MultiLockGuard {
    /// The names, bytewise in order.
    names: Arc<[Vec<u8>]>,
    /// One per name, in the same order.
    held: Vec<Held>,
    /// The release requests of every hold on one channel, once asked for.
    requests: OnceLock<(Receiver<ReleaseRequest>, Vec<RequestsStop>)>,
}

impl std::fmt::Debug for MultiLockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<_> = self.held.iter().map(|h| text(h.key())).collect();
        f.debug_struct("MultiLockGuard")
            .field("keys", &keys)
            .field("is_held", &self.is_held())
            .finish()
    }
}

impl MultiLockGuard {
    pub(super) fn new(names: Arc<[Vec<u8>]>, held: Vec<Held>) -> MultiLockGuard {
        MultiLockGuard {
            names,
            held,
            requests: OnceLock::new(),
        }
    }

    /// The names held, bytewise in order.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.multi_lock(["b", "a"])?.lock()?;
    /// assert_eq!(guard.names(), [b"a", b"b"]);
    /// # Ok(()) }
    /// ```
    pub fn names(&self) -> Vec<&[u8]> {
        self.names.iter().map(Vec::as_slice).collect()
    }

    /// Our keys in etcd, one per name in the order of [`names`](MultiLockGuard::names):
    /// `<name>/<lease id in hex>` (`.shared` for a read side).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.multi_lock(["a", "b"])?.lock()?;
    /// assert!(guard.keys()[1].starts_with(b"b/"));
    /// # Ok(()) }
    /// ```
    pub fn keys(&self) -> Vec<&[u8]> {
        self.held.iter().map(Held::key).collect()
    }

    /// Each name with its fencing token (its key's create revision), in the order of
    /// [`names`](MultiLockGuard::names). Each grows with every acquisition of its name, as
    /// [`Guard::fencing_token`](crate::Guard::fencing_token) does.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.multi_lock(["a", "b"])?.lock()?;
    /// let tokens = guard.fencing_tokens();
    /// assert_eq!(tokens[0].0, b"a");
    /// # Ok(()) }
    /// ```
    pub fn fencing_tokens(&self) -> Vec<(&[u8], i64)> {
        (self.names.iter().zip(&self.held))
            .map(|(n, h)| (n.as_slice(), h.rev()))
            .collect()
    }

    /// The fencing token of `name`, if this guard holds it.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.multi_lock(["a", "b"])?.lock()?;
    /// assert!(guard.fencing_token("a").is_some());
    /// assert_eq!(guard.fencing_token("c"), None);
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self, name: impl AsRef<[u8]>) -> Option<i64> {
        let name = name.as_ref();
        (self.names.iter().zip(&self.held))
            .find(|(n, _)| n.as_slice() == name)
            .map(|(_, h)| h.rev())
    }

    /// Whether every lock is still held as far as this process knows (see
    /// [`Guard::is_held`](crate::Guard::is_held)): false from the first loss of any key.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert!(session.multi_lock(["a", "b"])?.lock()?.is_held());
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.held.iter().all(Held::is_held)
    }

    /// A channel that becomes ready (disconnected) at the first loss of any of the keys
    /// (deleted by anyone, the session's lease deadline passed or the session ended), or
    /// when the guard is released. Nothing is ever sent on it.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.multi_lock(["a", "b"])?.lock()?;
    /// let lost = guard.lost();
    /// std::thread::spawn(move || { let _ = lost.recv(); eprintln!("lost one of them"); });
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> Receiver<()> {
        // Every hold shares one signal; any of them tells the session's deadline.
        match self.held.first() {
            Some(h) => h.lost(),
            None => crossbeam_channel::never(),
        }
    }

    /// A channel that receives every request to let go of any of the keys
    /// ([`Client::request_release`](crate::Client::request_release) on one of the names);
    /// [`ReleaseRequest::key`] says which. As [`Guard::release_requested`](crate::Guard::release_requested):
    /// the first call starts following the requests, requests made earlier in the hold
    /// arrive too, and the channel stays open until the guard is dropped.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.multi_lock(["a", "b"])?.lock()?;
    /// if let Ok(request) = guard.release_requested().recv() {
    ///     eprintln!("{} wants {}", request.requester, String::from_utf8_lossy(&request.key));
    /// }
    /// # Ok(()) }
    /// ```
    pub fn release_requested(&self) -> Receiver<ReleaseRequest> {
        let (receiver, _) = self.requests.get_or_init(|| {
            let (sender, receiver) = crossbeam_channel::unbounded();
            let stops = self
                .held
                .iter()
                .map(|held| held.forward_release_requests(sender.clone()))
                .collect();
            (receiver, stops)
        });
        receiver.clone()
    }

    /// The conditions "we still hold every key" (each key's create revision), to add to
    /// your own transactions.
    ///
    /// ```no_run
    /// use etcd_sync::{Txn, TxnOp};
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.multi_lock(["a", "b"])?.lock()?;
    /// let txn = Txn::new().when(guard.ownership_compares()).and_then([TxnOp::put("k", "v")]);
    /// assert!(session.client().txn(txn)?.succeeded);
    /// # Ok(()) }
    /// ```
    pub fn ownership_compares(&self) -> Vec<Compare> {
        self.held
            .iter()
            .map(|h| Compare::create_revision(h.key().to_vec(), CompareOp::Equal, h.rev()))
            .collect()
    }

    /// Runs `txn` only while every key is still ours, atomically with that check (one Txn
    /// that compares every key); returns `txn`'s own response.
    ///
    /// # Errors
    ///
    /// As [`Guard::txn`](crate::Guard::txn): [`Error::LockLost`] if any key is no longer
    /// ours (nothing was written), [`Error::SessionLost`], [`Error::Timeout`] /
    /// [`Error::Unavailable`] (not retried), [`Error::Server`], [`Error::Authentication`],
    /// [`Error::InsideAsyncRuntime`].
    ///
    /// ```no_run
    /// use etcd_sync::{Txn, TxnOp};
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.multi_lock(["account/4", "account/17"])?.lock()?;
    /// guard.txn(Txn::new().and_then([TxnOp::put("balance/4", "110"), TxnOp::put("balance/17", "90")]))?;
    /// # Ok(()) }
    /// ```
    pub fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        ownership::guarded_txn_all(&self.held, txn)?.ok_or(Error::LockLost)
    }

    /// Puts `key = value` only while every key is ours: the store revision of the write.
    ///
    /// # Errors
    ///
    /// As [`txn`](MultiLockGuard::txn); [`Error::InvalidArgument`] for an empty `key`.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.multi_lock(["a", "b"])?.lock()?;
    /// assert!(guard.put("state", "written under a and b")? > 0);
    /// # Ok(()) }
    /// ```
    pub fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<i64> {
        let key = crate::client::non_empty_key(key.as_ref())?;
        let response = self.txn(Txn::new().and_then([TxnOp::put(key, value.as_ref())]))?;
        Ok(response.revision)
    }

    /// Deletes `key` only while every key is ours: how many keys went (0 or 1).
    ///
    /// # Errors
    ///
    /// As [`put`](MultiLockGuard::put).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.multi_lock(["a", "b"])?.lock()?;
    /// guard.delete("state")?;
    /// # Ok(()) }
    /// ```
    pub fn delete(&self, key: impl AsRef<[u8]>) -> Result<i64> {
        let key = crate::client::non_empty_key(key.as_ref())?;
        let response = self.txn(Txn::new().and_then([TxnOp::delete(key)]))?;
        Ok(match response.responses.first() {
            Some(TxnOpResponse::Delete { deleted }) => *deleted,
            _ => 0,
        })
    }

    /// Releases every lock, all at once, and reports the outcome within about one request
    /// timeout. Every key is released whatever happens to the others; the first error (by
    /// name order) is returned.
    ///
    /// # Errors
    ///
    /// As [`Guard::release`](crate::Guard::release) for any one key:
    /// [`Error::LockLost`] if a key was no longer ours (nothing of it was deleted),
    /// [`Error::Timeout`] with [`Operation::Release`](crate::Operation::Release) (that release goes on in the
    /// background), [`Error::SessionLost`], [`Error::Server`], [`Error::Authentication`],
    /// [`Error::InsideAsyncRuntime`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// session.multi_lock(["a", "b"])?.lock()?.release()?;
    /// # Ok(()) }
    /// ```
    pub fn release(mut self) -> Result<()> {
        crate::client::runtime::ensure_blocking_allowed()?;
        let Some(first) = self.held.first() else {
            return Ok(());
        };
        let wait = first.request_timeout();
        let mut outcome = Ok(());
        for released in ownership::release_together(&mut self.held, Some(wait)) {
            let released = match released {
                Ok(Released::Deleted) => Ok(()),
                Ok(Released::NotOurs | Released::NotCurrent) => Err(Error::LockLost),
                Err(e) => Err(e),
            };
            if outcome.is_ok() {
                outcome = released;
            }
        }
        outcome
    }
}

impl Drop for MultiLockGuard {
    fn drop(&mut self) {
        release_all(std::mem::take(&mut self.held));
    }
}
