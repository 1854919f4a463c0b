//! The one guard family: [`Guard`], generic over a sealed [`GuardKind`] (in the style of
//! `lock_api`), wraps the ownership core's [`Held`] and carries the surface every guard
//! shares, written once: key, fencing token, `is_held`, `lost`, guarded writes, `release`.
//! The public names are aliases ([`MutexGuard`](crate::MutexGuard),
//! [`RwLockReadGuard`](crate::RwLockReadGuard), [`RwLockWriteGuard`](crate::RwLockWriteGuard),
//! [`Permit`](crate::Permit), [`Leadership`](crate::Leadership)); what only a leader does
//! (`proclaim`, `is_leader`, `resign`) is `impl Guard<LeaderKind>` in `election/mod.rs`.

use std::borrow::Cow;
use std::marker::PhantomData;

use crossbeam_channel::Receiver;

use crate::ownership::{Held, Released};
use crate::support::error::{Error, Result};
use crate::support::kv::{Compare, CompareOp, Txn, TxnResponse, text};

mod sealed {
    /// What differs between guard kinds, kept out of the public API.
    pub trait Sealed {
        /// The alias's name, for `Debug`.
        const TYPE_NAME: &'static str;
        /// The error of a guarded write or a release when the key is no longer ours.
        fn not_ours() -> crate::support::error::Error;
    }
}

/// What a [`Guard`] holds: a lock ([`MutexKind`]), either side of a read-write lock
/// ([`ReadKind`], [`WriteKind`]), a semaphore's permit ([`PermitKind`]) or an election's
/// leadership ([`LeaderKind`]). Sealed: the five kinds are all there are. Use it to write
/// code once for every guard.
///
/// ```no_run
/// use etcd_sync::{Guard, GuardKind};
///
/// fn report<K: GuardKind>(guard: &Guard<K>) {
///     println!("{} {} (token {})", K::WHAT, guard.key_str(), guard.fencing_token());
/// }
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// report(&session.mutex("m")?.lock()?);
/// report(&session.election("e")?.campaign("host-a")?);
/// # Ok(()) }
/// ```
pub trait GuardKind: sealed::Sealed {
    /// What a guard of this kind holds, for messages: `"lock"`, `"read lock"`,
    /// `"write lock"`, `"permit"` or `"leadership"`.
    ///
    /// ```
    /// use etcd_sync::{GuardKind, LeaderKind, MutexKind};
    /// assert_eq!(MutexKind::WHAT, "lock");
    /// assert_eq!(LeaderKind::WHAT, "leadership");
    /// ```
    const WHAT: &'static str;
}

/// The kind of [`MutexGuard`](crate::MutexGuard): a [`Mutex`](crate::Mutex)'s lock.
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let guard: etcd_sync::Guard<etcd_sync::MutexKind> = session.mutex("m")?.lock()?;
/// # let _ = guard;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub enum MutexKind {}

impl sealed::Sealed for MutexKind {
    const TYPE_NAME: &'static str = "MutexGuard";
    fn not_ours() -> Error {
        Error::LockLost
    }
}

impl GuardKind for MutexKind {
    const WHAT: &'static str = "lock";
}

/// The kind of [`RwLockReadGuard`](crate::RwLockReadGuard): an
/// [`RwLock`](crate::RwLock)'s read side.
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let guard: etcd_sync::Guard<etcd_sync::ReadKind> = session.rwlock("m")?.read()?;
/// # let _ = guard;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub enum ReadKind {}

impl sealed::Sealed for ReadKind {
    const TYPE_NAME: &'static str = "RwLockReadGuard";
    fn not_ours() -> Error {
        Error::LockLost
    }
}

impl GuardKind for ReadKind {
    const WHAT: &'static str = "read lock";
}

/// The kind of [`RwLockWriteGuard`](crate::RwLockWriteGuard): an
/// [`RwLock`](crate::RwLock)'s write side.
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let guard: etcd_sync::Guard<etcd_sync::WriteKind> = session.rwlock("m")?.write()?;
/// # let _ = guard;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub enum WriteKind {}

impl sealed::Sealed for WriteKind {
    const TYPE_NAME: &'static str = "RwLockWriteGuard";
    fn not_ours() -> Error {
        Error::LockLost
    }
}

impl GuardKind for WriteKind {
    const WHAT: &'static str = "write lock";
}

/// The kind of [`Permit`](crate::Permit): one permit of a
/// [`Semaphore`](crate::Semaphore).
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let permit: etcd_sync::Guard<etcd_sync::PermitKind> = session.semaphore("m", 2)?.acquire()?;
/// # let _ = permit;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub enum PermitKind {}

impl sealed::Sealed for PermitKind {
    const TYPE_NAME: &'static str = "Permit";
    fn not_ours() -> Error {
        Error::LockLost
    }
}

impl GuardKind for PermitKind {
    const WHAT: &'static str = "permit";
}

/// The kind of [`Leadership`](crate::Leadership): an [`Election`](crate::Election)
/// won. Its guards also have `is_leader`, `proclaim` and `resign`, and report
/// [`Error::NotLeader`] where the locks report [`Error::LockLost`].
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let leadership: etcd_sync::Guard<etcd_sync::LeaderKind> =
///     session.election("e")?.campaign("host-a")?;
/// # let _ = leadership;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub enum LeaderKind {}

impl sealed::Sealed for LeaderKind {
    const TYPE_NAME: &'static str = "Leadership";
    fn not_ours() -> Error {
        Error::NotLeader
    }
}

impl GuardKind for LeaderKind {
    const WHAT: &'static str = "leadership";
}

/// Proof that a lock, read or write lock, permit or leadership is held; releases it on
/// `Drop`. Use it by its aliases: [`MutexGuard`](crate::MutexGuard),
/// [`RwLockReadGuard`](crate::RwLockReadGuard), [`RwLockWriteGuard`](crate::RwLockWriteGuard),
/// [`Permit`](crate::Permit), [`Leadership`](crate::Leadership); the kind `K` says which
/// (see [`GuardKind`]).
///
/// Every guard has the same surface: its [`key`](Guard::key) and
/// [`fencing_token`](Guard::fencing_token), [`is_held`](Guard::is_held) and
/// [`lost`](Guard::lost) (a loss is the session's lease deadline passing, the key seen
/// deleted, or, for a leadership, a re-campaign that superseded it), writes that commit
/// only while it is held ([`put`](Guard::put), [`delete`](Guard::delete),
/// [`txn`](Guard::txn), [`ownership_compare`](Guard::ownership_compare)), and
/// [`release`](Guard::release) to give it up and see the outcome.
///
/// Release deletes the key only if it still has our create revision, so a late or repeated
/// release can never delete a newer holder's key. `Drop` never blocks longer than the
/// client's request timeout, and inside an async runtime it hands the release to the
/// client's own runtime instead of blocking.
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let guard = session.mutex("leader-only-job")?.lock()?;
/// crossbeam_channel::select! {
///     recv(guard.lost()) -> _ => eprintln!("lock lost: stop now"),
///     default(std::time::Duration::from_secs(1)) => println!("did a second of work"),
/// }
/// guard.release()?;
/// # Ok(()) }
/// ```
#[must_use = "the guard releases as soon as it is dropped"]
pub struct Guard<K: GuardKind> {
    pub(crate) held: Held,
    /// A downgradable write's shared twin key, held with the writer key and released with
    /// it; the read guard's hold after [`downgrade`](Guard::downgrade). Dropped after
    /// `held`.
    pub(crate) twin: Option<Held>,
    /// `fn() -> K`: whether a guard is `Send` and `Sync` does not depend on its kind.
    kind: PhantomData<fn() -> K>,
}

impl<K: GuardKind> std::fmt::Debug for Guard<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(<K as sealed::Sealed>::TYPE_NAME)
            .field("key", &self.key_str())
            .field("fencing_token", &self.held.rev())
            .field("is_held", &self.is_held())
            .finish()
    }
}

impl<K: GuardKind> Guard<K> {
    pub(crate) fn new(held: Held) -> Guard<K> {
        Guard {
            held,
            twin: None,
            kind: PhantomData,
        }
    }

    /// A guard over `held` and its twin `twin` (which share their "lost" signal).
    pub(crate) fn with_twin(held: Held, twin: Held) -> Guard<K> {
        Guard {
            held,
            twin: Some(twin),
            kind: PhantomData,
        }
    }

    /// The error of a guarded write or a release when the key is no longer ours.
    fn not_ours() -> Error {
        <K as sealed::Sealed>::not_ours()
    }

    /// The guard's key in etcd: `<name>/<lease id in hex>`, with a suffix for shared keys
    /// and permits (`.shared`, `.permits-<N>`).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("m")?.lock()?;
    /// assert!(guard.key().starts_with(b"m/"));
    /// # Ok(()) }
    /// ```
    pub fn key(&self) -> &[u8] {
        self.held.key()
    }

    /// The key as text.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// println!("{}", session.rwlock("m")?.read()?.key_str());
    /// # Ok(()) }
    /// ```
    pub fn key_str(&self) -> Cow<'_, str> {
        text(self.key())
    }

    /// The fencing token: our key's create revision. It grows with every acquisition
    /// under the name (successive leaders included), so storage that remembers the
    /// highest token it has seen can reject a write from a holder that has since lost its
    /// hold. A [`Leadership`](crate::Leadership) handed over to us
    /// ([`hand_over`](Guard::hand_over)) holds the old leader's key, and its token is the
    /// create revision of the key we waited with: above the old leader's. (A candidate
    /// the hand-over passed over, waiting between the two, gets a smaller token when it
    /// leads later.)
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let first = session.mutex("m")?.lock()?.fencing_token();
    /// let second = session.mutex("m")?.lock()?.fencing_token();
    /// assert!(second > first);
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> i64 {
        self.held.token()
    }

    /// The create revision of the key we hold (Go's `Election.Rev()`): the revision
    /// [`ownership_compare`](Guard::ownership_compare) compares. It equals the
    /// [`fencing_token`](Guard::fencing_token), except for a leadership handed over to
    /// us ([`hand_over`](Guard::hand_over)): that holds the old leader's key, created
    /// before the key we waited with.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("m")?.lock()?;
    /// assert_eq!(guard.create_revision(), guard.fencing_token());
    /// # Ok(()) }
    /// ```
    pub fn create_revision(&self) -> i64 {
        self.held.rev()
    }

    /// Whether it is still held as far as this process knows: not released (nor, for a
    /// leadership, resigned or superseded by a re-campaign), the session's lease deadline
    /// has not passed, and our key has not been seen deleted. No request is sent; use a
    /// guarded write to have etcd confirm.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let permit = session.semaphore("m", 2)?.acquire()?;
    /// assert!(permit.is_held());
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// A channel that becomes ready (disconnected) when the hold may be lost or is given
    /// up: the session's lease deadline passed or the session ended, our key was seen
    /// deleted, the guard was released (or, for a leadership, resigned or superseded by a
    /// re-campaign). Nothing is ever sent on it.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("m")?.lock()?;
    /// let lost = guard.lost();
    /// std::thread::spawn(move || { let _ = lost.recv(); eprintln!("lost it"); });
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> Receiver<()> {
        self.held.lost()
    }

    /// A channel that receives every request to let go of this hold
    /// ([`Client::request_release`](crate::Client::request_release), `Mutex::request_release`,
    /// `etcd-sync revoke`), naming who asked. The holder decides: a request changes nothing
    /// by itself. A request made before this call (during the hold) arrives too, so it is
    /// never missed by calling late; one made for an earlier hold of the key does not.
    ///
    /// The first call starts following the hold's request key on the client's watch stream
    /// (a guard that never asks costs etcd nothing); every call returns the same channel,
    /// which stays open until the guard is dropped, so a `select!` over it and
    /// [`lost`](Guard::lost) does not spin after a loss.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("shard-7")?.lock()?;
    /// let asked = guard.release_requested();
    /// loop {
    ///     crossbeam_channel::select! {
    ///         recv(asked) -> request => {
    ///             if let Ok(request) = request {
    ///                 eprintln!("{} asks for shard-7", request.requester);
    ///             }
    ///             break; // finish up, then release
    ///         }
    ///         recv(guard.lost()) -> _ => break,
    ///         default(std::time::Duration::from_millis(100)) => { /* a unit of work */ }
    ///     }
    /// }
    /// guard.release()?;
    /// # Ok(()) }
    /// ```
    pub fn release_requested(&self) -> Receiver<crate::line::request::ReleaseRequest> {
        self.held.release_requested()
    }

    /// The condition "our key still has our create revision", to add to your own
    /// transactions: Go's `Mutex.IsOwner()`. For a [`Leadership`](crate::Leadership) add
    /// [`lease_compare`](Guard::lease_compare) too: a leadership handed over
    /// ([`hand_over`](Guard::hand_over)) keeps its key and create revision on the
    /// successor's lease. The guard's own writes ([`put`](Guard::put), [`txn`](Guard::txn))
    /// compare both.
    ///
    /// ```no_run
    /// use etcd_sync::{Txn, TxnOp};
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("m")?.lock()?;
    /// let r = session.client().txn(
    ///     Txn::new().when([guard.ownership_compare()]).and_then([TxnOp::put("k", "v")]),
    /// )?;
    /// assert!(r.succeeded);
    /// # Ok(()) }
    /// ```
    pub fn ownership_compare(&self) -> Compare {
        Compare::create_revision(self.key().to_vec(), CompareOp::Equal, self.held.rev())
    }

    /// The condition "our key is still bound to our session's lease": with
    /// [`ownership_compare`](Guard::ownership_compare), what the guard's own writes
    /// require, and what tells a leader from its predecessor after a
    /// [`hand_over`](Guard::hand_over).
    ///
    /// ```no_run
    /// use etcd_sync::{Txn, TxnOp};
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let leadership = session.election("e")?.campaign("a")?;
    /// let ours = [leadership.ownership_compare(), leadership.lease_compare()];
    /// let r = session.client().txn(Txn::new().when(ours).and_then([TxnOp::put("k", "v")]))?;
    /// assert!(r.succeeded);
    /// # Ok(()) }
    /// ```
    pub fn lease_compare(&self) -> Compare {
        Compare::lease(self.key().to_vec(), CompareOp::Equal, self.held.lease_id())
    }

    /// Puts `key = value` only while we hold it. Returns the store revision of the write,
    /// as [`Client::put`](crate::Client::put) does (use [`txn`](Guard::txn) for the whole
    /// response).
    ///
    /// # Errors
    ///
    /// * [`Error::LockLost`] ([`Error::NotLeader`] for a [`Leadership`](crate::Leadership)):
    ///   the guard was released, resigned or superseded by a re-campaign, or our key no
    ///   longer has our create revision (deleted by someone else, or gone with the
    ///   session's lease); nothing was written.
    /// * [`Error::SessionLost`]: the session is known lost (etcd said so, or no keep-alive
    ///   was acknowledged before the lease deadline); nothing was sent.
    /// * [`Error::InvalidArgument`]: `key` is empty; nothing was sent.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: etcd did not answer. Not retried: the
    ///   write may or may not have been applied.
    /// * [`Error::Server`]: etcd refused the transaction (e.g. `PermissionDenied`, or
    ///   `InvalidArgument` for a value above its size limit); [`Error::Authentication`]:
    ///   re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("m")?.lock()?;
    /// let revision = guard.put("state", "written by the holder")?;
    /// assert!(revision > 0);
    /// # Ok(()) }
    /// ```
    pub fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<i64> {
        self.held
            .put(key.as_ref(), value.as_ref())?
            .ok_or_else(Self::not_ours)
    }

    /// Deletes `key` only while we hold it. Returns the number of keys deleted (0 or 1),
    /// as [`Client::delete`](crate::Client::delete) does.
    ///
    /// # Errors
    ///
    /// As [`put`](Guard::put).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let leadership = session.election("e")?.campaign("v")?;
    /// leadership.delete("config/stale")?;
    /// # Ok(()) }
    /// ```
    pub fn delete(&self, key: impl AsRef<[u8]>) -> Result<i64> {
        self.held.delete(key.as_ref())?.ok_or_else(Self::not_ours)
    }

    /// Runs `txn` only while we hold it, atomically with that check; returns `txn`'s own
    /// response. A failed comparison of `txn` itself is not an error: `Ok` with
    /// `succeeded == false`. Nothing is sent once this process knows the hold is over.
    ///
    /// # Errors
    ///
    /// As [`put`](Guard::put), except that an empty key is etcd's [`Error::Server`] with
    /// code `InvalidArgument`.
    ///
    /// ```no_run
    /// use etcd_sync::{Compare, CompareOp, Txn, TxnOp};
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.mutex("m")?.lock()?;
    /// let r = guard.txn(
    ///     Txn::new()
    ///         .when([Compare::version("job", CompareOp::Equal, 0)])
    ///         .and_then([TxnOp::put("job", "started")]),
    /// )?;
    /// println!("started: {}", r.succeeded);
    /// # Ok(()) }
    /// ```
    pub fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.held.guarded_txn(txn)?.ok_or_else(Self::not_ours)
    }

    /// Releases and reports the outcome. Returns within about one request timeout; if
    /// etcd has not answered by then, the release goes on in the background (the next
    /// acquisition of this session and name waits for it) and this returns
    /// [`Error::Timeout`].
    ///
    /// It takes the guard by value, like `parking_lot`'s `MutexGuard::unlock`: after it
    /// the hold is over whatever the outcome. Dropping the guard releases too, without
    /// reporting. A leader that must know it has stepped down calls
    /// [`Leadership::resign`](Guard::resign) instead, which can be called again.
    ///
    /// # Errors
    ///
    /// * [`Error::LockLost`] ([`Error::NotLeader`] for a [`Leadership`](crate::Leadership)):
    ///   our key was seen deleted, or it no longer had our create revision (deleted by
    ///   someone else, or gone with the session's revoked or closed lease), or a
    ///   re-campaign superseded this leadership. Nothing else was deleted. One exception
    ///   cannot be told apart: when the answer to the delete was lost and etcd had applied
    ///   it, the retry finds the key gone and also reports `LockLost`. Either way the key is
    ///   gone when this returns.
    /// * [`Error::Timeout`] with [`Operation::Release`](crate::Operation::Release): etcd
    ///   did not answer within the request timeout; the release goes on.
    /// * [`Error::SessionLost`]: the session is lost and etcd could not be reached; the
    ///   key goes with the lease.
    /// * [`Error::Server`] / [`Error::Authentication`]: etcd refused the delete.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread (the guard is
    ///   dropped, and its `Drop` releases in the background).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.rwlock("m")?.write()?;
    /// guard.release()?;
    /// # Ok(()) }
    /// ```
    pub fn release(self) -> Result<()> {
        let Guard { mut held, twin, .. } = self;
        let released = match twin {
            None => held.release_now()?,
            // A downgradable write: both keys, sent together; the writer key's outcome.
            Some(twin) => {
                crate::client::runtime::ensure_blocking_allowed()?;
                let wait = Some(held.request_timeout());
                let mut both = [held, twin];
                let outcomes = crate::ownership::release_together(&mut both, wait);
                (outcomes.into_iter().next()).unwrap_or(Ok(Released::NotCurrent))?
            }
        };
        match released {
            Released::Deleted => Ok(()),
            Released::NotOurs | Released::NotCurrent => Err(Self::not_ours()),
        }
    }
}
