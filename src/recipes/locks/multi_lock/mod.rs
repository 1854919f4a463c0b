//! Several locks at once (Curator's `InterProcessMultiLock`, Redisson's `MultiLock`): all
//! or none, in one canonical order (bytewise by name), so two processes locking `{a, b}`
//! and `{b, a}` never deadlock. Every name that is free is joined in one Txn
//! (`ownership::lock_free_prefix`); from the first busy name on, the names are taken one
//! at a time through the ownership core's one acquire path. The guard holds every key:
//! its "lost" signal is shared by every hold (the first loss fires it), and its guarded
//! writes compare every key in one Txn.

use std::sync::Arc;
use std::time::Duration;

use crate::line::mode::Mode;
use crate::ownership::{self, Held, Place, Wait};
use crate::recipes::locks::mutex::Mutex;
use crate::recipes::locks::rwlock::RwLock;
use crate::session::Session;
use crate::support::cancel::{CancelToken, WaitOptions};
use crate::support::error::operation::Operation;
use crate::support::error::try_lock::TryLockError;
use crate::support::error::{Error, Result};
use crate::support::kv::text;
use crate::support::signal::Signal;

mod guard;

pub use guard::MultiLockGuard;

/// The most names (or members) one [`MultiLock`] may have: 64. Its guarded writes carry one
/// compare per key in one Txn, and etcd refuses a Txn of more than 128 compares by default
/// (`--max-txn-ops`).
///
/// ```
/// assert_eq!(etcd_sync::MAX_MULTI_LOCK_NAMES, 64);
/// ```
pub const MAX_MULTI_LOCK_NAMES: usize = 64;

/// One lock of a [`MultiLock`] built from existing handles: a [`Mutex`] (`From<&Mutex>`),
/// or a side of an [`RwLock`] ([`read`](MultiLockMember::read),
/// [`write`](MultiLockMember::write)). It keeps the handle's lock-delay.
///
/// ```no_run
/// use etcd_sync::{MultiLock, MultiLockMember};
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let catalog = session.rwlock("catalog")?;
/// let orders = session.mutex("orders")?;
/// let both = MultiLock::new([MultiLockMember::read(&catalog), (&orders).into()])?;
/// let _guard = both.lock()?; // catalog shared with other readers, orders exclusive
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MultiLockMember {
    line: Arc<Place>,
    operation: Operation,
    delay: Duration,
}

impl MultiLockMember {
    /// The read side of `lock`: shared with other readers of its name.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let member = etcd_sync::MultiLockMember::read(&session.rwlock("catalog")?);
    /// # let _ = member;
    /// # Ok(()) }
    /// ```
    pub fn read(lock: &RwLock) -> MultiLockMember {
        let (line, delay) = lock.line_and_delay(false);
        MultiLockMember {
            line: line.clone(),
            operation: Operation::Read,
            delay,
        }
    }

    /// The write side of `lock`: exclusive, like a [`Mutex`] of its name.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let member = etcd_sync::MultiLockMember::write(&session.rwlock("catalog")?);
    /// # let _ = member;
    /// # Ok(()) }
    /// ```
    pub fn write(lock: &RwLock) -> MultiLockMember {
        let (line, delay) = lock.line_and_delay(true);
        MultiLockMember {
            line: line.clone(),
            operation: Operation::Write,
            delay,
        }
    }

    /// The member's name.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let member = etcd_sync::MultiLockMember::from(&session.mutex("orders")?);
    /// assert_eq!(member.name(), b"orders");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &[u8] {
        self.line.name()
    }
}

impl From<&Mutex> for MultiLockMember {
    fn from(mutex: &Mutex) -> MultiLockMember {
        let (line, delay) = mutex.line_and_delay();
        MultiLockMember {
            line: line.clone(),
            operation: Operation::Lock,
            delay,
        }
    }
}

/// Several locks taken together, all or none: [`Session::multi_lock`] (exclusive locks of
/// several names), or [`MultiLock::new`] over [`Mutex`] and [`RwLock`] handles.
///
/// * **One order.** The names are taken bytewise by name, whatever order they were given
///   in, so two processes (or threads) locking `{a, b}` and `{b, a}` never wait on each
///   other crosswise. Duplicate names are refused (a set of locks, not a multiset:
///   deduplicate first).
/// * **One request when free.** Every free name is joined in one Txn (each key at one
///   revision, each name's place read by the same Txn): an uncontended set costs one round
///   trip, whatever its size. From the first busy name on, the set waits there and takes
///   the names after it one at a time; its keys on later names are removed first, so it
///   never holds a later name while it waits for an earlier one.
/// * **All or none.** A wait that fails, times out, is cancelled or (for
///   [`try_lock`](MultiLock::try_lock)) finds one name busy releases the names it took
///   before it returns; no key is left behind. A time limit is one deadline for the whole
///   set.
/// * **Each name as its own lock.** Every name is the line a [`Mutex`] of that name (or
///   the [`RwLock`] side) takes, with the same keys: a multi-lock excludes single holders
///   of each name, `etcdctl lock` and Go's `Mutex` too.
/// * **The guard holds every key:** [`MultiLockGuard`]. Its releases (one Txn per name)
///   are sent together.
///
/// A key taken early that is deleted while a later name is awaited ends the wait at once
/// with [`Error::LockLost`] (everything is released), as a lost session ends it with
/// [`Error::SessionLost`].
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let session = client.session()?;
/// let accounts = session.multi_lock(["account/17", "account/4"])?; // taken as 17, then 4
/// let guard = accounts.lock()?;
/// guard.put("balance/17", "90")?; // commits only while both locks are held
/// guard.put("balance/4", "110")?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MultiLock {
    /// Sorted bytewise by name, no duplicates, all on one session.
    members: Arc<[MultiLockMember]>,
    /// Their names, in the same order (shared with every guard).
    names: Arc<[Vec<u8>]>,
    /// Their lines and operations, in the same order (for the one-Txn join).
    lines: Arc<[(Arc<Place>, Operation)]>,
}

impl Session {
    /// Exclusive locks of every name in `names`, taken together: a [`MultiLock`]. Each
    /// name is the lock a [`mutex`](Session::mutex) of that name takes. No request is sent
    /// until you lock it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`]: `names` is empty, has more than
    /// [`MAX_MULTI_LOCK_NAMES`] names or a name twice, or a name is empty, ends with `/` or
    /// is longer than 4096 bytes.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let lock = session.multi_lock(["b", "a"])?;
    /// assert_eq!(lock.names(), [b"a", b"b"]); // the order they are taken in
    /// assert!(session.multi_lock(["a", "a"]).is_err()); // InvalidArgument
    /// # Ok(()) }
    /// ```
    pub fn multi_lock<I>(&self, names: I) -> Result<MultiLock>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let mut members = Vec::new();
        for name in names {
            if members.len() == MAX_MULTI_LOCK_NAMES {
                return Err(too_many());
            }
            let line = Place::of(self, name.as_ref(), Mode::Exclusive)?;
            members.push(MultiLockMember {
                line,
                operation: Operation::Lock,
                delay: Duration::ZERO,
            });
        }
        MultiLock::new(members)
    }
}

fn too_many() -> Error {
    Error::InvalidArgument(format!(
        "a multi-lock has at most {MAX_MULTI_LOCK_NAMES} names"
    ))
}

impl MultiLock {
    /// The locks of `members` taken together (mixed modes allowed: a [`Mutex`], the read
    /// or write side of an [`RwLock`]), each with its handle's lock-delay.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`]: no member, more than [`MAX_MULTI_LOCK_NAMES`], two
    /// members of one name (in any modes), or members of different sessions (a multi-lock
    /// lives and dies with one session).
    ///
    /// ```no_run
    /// use etcd_sync::{MultiLock, MultiLockMember};
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let config = session.rwlock("config")?;
    /// let deploy = session.mutex("deploy")?;
    /// let lock = MultiLock::new([MultiLockMember::write(&config), (&deploy).into()])?;
    /// assert_eq!(lock.names(), [b"config".as_slice(), b"deploy"]);
    /// # Ok(()) }
    /// ```
    pub fn new(members: impl IntoIterator<Item = MultiLockMember>) -> Result<MultiLock> {
        let mut members: Vec<MultiLockMember> = members.into_iter().collect();
        if members.is_empty() {
            return Err(Error::InvalidArgument(
                "a multi-lock needs at least one name".into(),
            ));
        }
        if members.len() > MAX_MULTI_LOCK_NAMES {
            return Err(too_many());
        }
        let serial = members[0].line.session().lease().serial();
        if members
            .iter()
            .any(|m| m.line.session().lease().serial() != serial)
        {
            return Err(Error::InvalidArgument(
                "every lock of a multi-lock must be on one session".into(),
            ));
        }
        members.sort_by(|a, b| a.name().cmp(b.name()));
        if let Some(pair) = members.windows(2).find(|w| w[0].name() == w[1].name()) {
            return Err(Error::InvalidArgument(format!(
                "a multi-lock names {:?} twice",
                text(pair[0].name())
            )));
        }
        let names = members.iter().map(|m| m.name().to_vec()).collect();
        let lines = members
            .iter()
            .map(|m| (m.line.clone(), m.operation))
            .collect();
        Ok(MultiLock {
            members: members.into(),
            names,
            lines,
        })
    }

    /// The names, in the order they are taken (bytewise).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert_eq!(session.multi_lock(["y", "x"])?.names(), [b"x", b"y"]);
    /// # Ok(()) }
    /// ```
    pub fn names(&self) -> Vec<&[u8]> {
        self.members.iter().map(MultiLockMember::name).collect()
    }

    /// The session the locks are taken with.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let lock = session.multi_lock(["x", "y"])?;
    /// assert_eq!(lock.session().lease_id(), session.lease_id());
    /// # Ok(()) }
    /// ```
    pub fn session(&self) -> &Session {
        self.members[0].line.session()
    }

    /// Blocks until every lock is held.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`] for any one name ([`Error::SessionLost`], [`Error::LockLost`],
    /// [`Error::WouldDeadlock`] when this thread holds a guard of one of the names on this
    /// session, [`Error::Timeout`] / [`Error::Unavailable`], [`Error::Server`],
    /// [`Error::Authentication`], [`Error::InsideAsyncRuntime`]); also
    /// [`Error::LockLost`] when a key taken earlier was deleted while a later name was
    /// awaited. On every error the names taken are released first.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let guard = session.multi_lock(["shard-1", "shard-2"])?.lock()?;
    /// assert!(guard.is_held());
    /// # Ok(()) }
    /// ```
    pub fn lock(&self) -> Result<MultiLockGuard> {
        ownership::blocking(self.acquire(Wait::forever()))
    }

    /// Like [`lock`](MultiLock::lock), but gives up with [`Error::Timeout`] once `timeout`
    /// has passed since the call, for the whole set (one deadline, not one per name), and
    /// releases what it took.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] ([`is_wait_timeout`](Error::is_wait_timeout), the operation of
    /// the name that was awaited: [`Operation::Lock`], or `Read`/`Write` for an
    /// [`RwLock`] side); otherwise as [`lock`](MultiLock::lock).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// match session.multi_lock(["a", "b"])?.lock_timeout(Duration::from_secs(5)) {
    ///     Ok(_guard) => println!("both held"),
    ///     Err(e) if e.is_wait_timeout() => println!("busy; nothing held"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lock_timeout(&self, timeout: Duration) -> Result<MultiLockGuard> {
        ownership::blocking(self.acquire(Wait::from_timeout(timeout)))
    }

    /// Like [`lock`](MultiLock::lock), with a time limit for the whole set and/or a
    /// [`CancelToken`](crate::CancelToken) ([`WaitOptions`]).
    ///
    /// # Errors
    ///
    /// [`Error::Cancelled`] (the names taken are released, no key is left behind),
    /// [`Error::Timeout`] as for [`lock_timeout`](MultiLock::lock_timeout); otherwise as
    /// [`lock`](MultiLock::lock).
    ///
    /// ```no_run
    /// use etcd_sync::CancelToken;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let token = CancelToken::new();
    /// match session.multi_lock(["a", "b"])?.lock_with(&token) {
    ///     Ok(_guard) => println!("both held"),
    ///     Err(e) if e.is_cancelled() => println!("shutting down"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lock_with(&self, options: impl Into<WaitOptions>) -> Result<MultiLockGuard> {
        ownership::blocking(self.acquire(Wait::from_options(options.into())))
    }

    /// Takes every lock only if each is free now (one Txn for them all when they are); if
    /// one is busy it releases those it took and returns `WouldBlock`.
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] as [`Mutex::try_lock`] for any one name;
    /// [`TryLockError::Error`] as [`lock`](MultiLock::lock).
    ///
    /// ```no_run
    /// use etcd_sync::TryLockError;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// match session.multi_lock(["a", "b"])?.try_lock() {
    ///     Ok(_guard) => println!("both held"),
    ///     Err(TryLockError::WouldBlock) => println!("one is busy; nothing held"),
    ///     Err(TryLockError::Error(e)) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_lock(&self) -> std::result::Result<MultiLockGuard, TryLockError> {
        self.acquire(Wait::never())
    }

    /// Takes the members in order under one `wait` (its deadline is one instant for all):
    /// every free name in one Txn, then, from the first busy one (where that Txn queued our
    /// key), name by name. The holds taken share one signal from the start, which also
    /// cancels the waits for the names after them: a key of ours deleted while a later
    /// name is awaited ends that wait at once.
    fn acquire(&self, wait: Wait) -> std::result::Result<MultiLockGuard, TryLockError> {
        let caller = wait.cancel_token().cloned();
        let ended = caller
            .as_ref()
            .map_or_else(CancelToken::new, CancelToken::child);
        let signal = Arc::new(Signal::cancelling(ended.cancellation()));
        let wait = wait.with_cancel(ended);
        // Every name that is free, in one Txn, and our key queued at the first busy one;
        // the rest (if any) name by name.
        let (mut held, mut queued) = ownership::lock_free_prefix(&self.lines, &wait)?;
        for h in &mut held {
            h.share_signal(&signal);
        }
        // Names the joint Txn did not own at once are taken later, at other revisions.
        let waited = held.len() < self.members.len();
        for member in &self.members[held.len()..] {
            let wait = wait.clone().with_delay(member.delay);
            let taken = match queued.take() {
                Some(queued) => ownership::wait_queued(queued, &wait),
                None => ownership::lock(&member.line, member.operation, wait),
            };
            match taken {
                Ok(mut h) => {
                    h.share_signal(&signal);
                    held.push(h);
                }
                Err(e) => {
                    guard::release_all(held);
                    return Err(match e {
                        // Our signal, not the caller's token: one of our holds ended.
                        TryLockError::Error(Error::Cancelled)
                            if !caller.as_ref().is_some_and(CancelToken::is_cancelled) =>
                        {
                            self.lost().into()
                        }
                        e => e,
                    });
                }
            }
        }
        // A key taken early may have gone just as the last name was taken.
        if !held.iter().all(Held::is_held) {
            guard::release_all(held);
            return Err(self.lost().into());
        }
        // Names owned at different instants (some after a wait): every key must still be
        // ours at one instant, which one Txn of compares proves (`all_still_ours`). Names
        // all owned at once by the joint Txn were proven together by it.
        if waited && held.len() > 1 {
            match ownership::all_still_ours(&held, &wait) {
                Ok(true) => {}
                Ok(false) => {
                    guard::release_all(held);
                    return Err(self.lost().into());
                }
                Err(e) => {
                    guard::release_all(held);
                    return Err(e.into());
                }
            }
        }
        Ok(MultiLockGuard::new(self.names.clone(), held))
    }

    /// Why a hold taken for this lock ended before the rest were taken.
    fn lost(&self) -> Error {
        match self.session().lease().check() {
            Err(e) => e,
            Ok(()) => Error::LockLost,
        }
    }
}
