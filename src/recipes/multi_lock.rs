//! Several locks at once (Curator's `InterProcessMultiLock`, Redisson's `MultiLock`): all
//! or none, taken one name at a time in one canonical order (bytewise by name), each
//! through the ownership core's one acquire path, so two processes locking `{a, b}` and
//! `{b, a}` never deadlock. The guard holds every key: its "lost" signal is shared by
//! every hold (the first loss fires it), and its guarded writes compare every key in one Txn.
//!
//! Not done: acquiring every free name in one Txn. The core's join is per line (the turn,
//! the exactly-once enqueue, the sweep after an ambiguous answer, the proof of ownership);
//! one Txn for N lines would have to redo each of those for N keys at once. Each name
//! costs what a `Mutex::lock` costs, one after the other (BENCHMARKS.md).

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;

use crate::line::mode::Mode;
use crate::ownership::{self, Held, Line, Released, Wait};
use crate::recipes::mutex::Mutex;
use crate::recipes::rwlock::RwLock;
use crate::session::Session;
use crate::support::cancel::WaitOptions;
use crate::support::error::operation::Operation;
use crate::support::error::try_lock::TryLockError;
use crate::support::error::{Error, Result};
use crate::support::kv::{Compare, Txn, TxnOp, TxnOpResponse, TxnResponse, text};
use crate::support::signal::Signal;

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
    line: Arc<Line>,
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
/// * **One order.** The names are taken one at a time, bytewise by name, whatever order
///   they were given in, so two processes (or threads) locking `{a, b}` and `{b, a}` never
///   wait on each other crosswise. Duplicate names are refused (a set of locks, not a
///   multiset: deduplicate first).
/// * **All or none.** A wait that fails, times out, is cancelled or (for
///   [`try_lock`](MultiLock::try_lock)) finds one name busy releases the names it took
///   before it returns; no key is left behind. A time limit is one deadline for the whole
///   set.
/// * **Each name as its own lock.** Every name is the line a [`Mutex`] of that name (or
///   the [`RwLock`] side) takes, with the same keys: a multi-lock excludes single holders
///   of each name, `etcdctl lock` and Go's `Mutex` too.
/// * **The guard holds every key:** [`MultiLockGuard`].
///
/// Not done: taking every free name in one Txn. Each name is one `Mutex::lock` (one Txn
/// when free), one after the other; release is one Txn per name too.
///
/// A key taken early that is deleted while a later name is awaited is noticed when that
/// wait ends ([`Error::LockLost`]: everything is released); a lost session ends the wait
/// at once.
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
}

impl Session {
    /// Exclusive locks of every name in `names`, taken together: a [`MultiLock`]. Each
    /// name is the lock a [`mutex`](Session::mutex) of that name takes. No request is sent
    /// until you lock it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`]: `names` is empty, has more than
    /// [`MAX_MULTI_LOCK_NAMES`] names or a name twice, or a name is empty or longer than
    /// 4096 bytes.
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
            let line = Line::of(self, name.as_ref(), Mode::Exclusive)?;
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
        Ok(MultiLock {
            members: members.into(),
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

    /// Takes every lock only if each is free now, in order; at the first busy one it
    /// releases those it took and returns `WouldBlock`.
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

    /// Takes the members in order under one `wait` (its deadline is one instant for all).
    fn acquire(&self, wait: Wait) -> std::result::Result<MultiLockGuard, TryLockError> {
        let mut held = Vec::with_capacity(self.members.len());
        for member in self.members.iter() {
            let wait = wait.clone().with_delay(member.delay);
            match ownership::lock(&member.line, member.operation, wait) {
                Ok(h) => held.push(h),
                Err(e) => {
                    release_all(held);
                    return Err(e);
                }
            }
        }
        // A key taken early may have gone while a later name was awaited.
        if !held.iter().all(Held::is_held) {
            let lost = match self.session().lease().check() {
                Err(e) => e,
                Ok(()) => Error::LockLost,
            };
            release_all(held);
            return Err(lost.into());
        }
        let signal = Arc::new(Signal::new());
        for h in &mut held {
            h.share_signal(&signal);
        }
        Ok(MultiLockGuard {
            members: self.members.clone(),
            held,
        })
    }
}

/// Releases in reverse order, each as a guard's `Drop` does.
fn release_all(mut held: Vec<Held>) {
    while let Some(h) = held.pop() {
        drop(h);
    }
}

/// Proof that every lock of a [`MultiLock`] is held; releases them all on `Drop` (in
/// reverse order, each as a [`MutexGuard`](crate::MutexGuard) does: at most one request
/// timeout each).
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
    members: Arc<[MultiLockMember]>,
    /// One per member, in the same order.
    held: Vec<Held>,
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
        self.members.iter().map(MultiLockMember::name).collect()
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
        (self.members.iter().zip(&self.held))
            .map(|(m, h)| (m.name(), h.rev()))
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
        (self.members.iter().zip(&self.held))
            .find(|(m, _)| m.name() == name)
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
            .map(|h| {
                Compare::create_revision(
                    h.key().to_vec(),
                    crate::support::kv::CompareOp::Equal,
                    h.rev(),
                )
            })
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

    /// Releases every lock (in reverse order) and reports the outcome. Every key is
    /// released whatever happens to the others; the first error is returned.
    ///
    /// # Errors
    ///
    /// As [`Guard::release`](crate::Guard::release) for any one key:
    /// [`Error::LockLost`] if a key was no longer ours (nothing of it was deleted),
    /// [`Error::Timeout`] with [`Operation::Release`] (that release goes on in the
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
        let mut first = Ok(());
        while let Some(mut h) = self.held.pop() {
            let outcome = match h.release_now() {
                Ok(Released::Deleted) => Ok(()),
                Ok(Released::NotOurs | Released::NotCurrent) => Err(Error::LockLost),
                Err(e) => Err(e),
            };
            if first.is_ok() {
                first = outcome;
            }
        }
        first
    }
}

impl Drop for MultiLockGuard {
    fn drop(&mut self) {
        release_all(std::mem::take(&mut self.held));
    }
}
