//! What `etcd-sync lock` takes: the exclusive lock (a `Mutex`, etcdctl's), one permit of a
//! semaphore (`-n N`) or the read side of a read-write lock (`--shared`). Past acquiring,
//! the tool treats the three guards alike through [`LockGuard`], so holding, running CMD,
//! loss and release have one code path whatever the mode.

use crossbeam_channel::Receiver;
use etcd_sync::{Guard, GuardKind, Mutex, ReleaseRequest, RwLock, Semaphore, Session, WaitOptions};

use crate::args::LockArgs;

/// A lock, read lock or permit while held. `Send`: it is acquired on a worker thread.
pub trait LockGuard: Send {
    /// What is held, for messages: "lock", "read lock" or "permit".
    fn what(&self) -> &'static str;
    fn key(&self) -> String;
    fn fencing_token(&self) -> i64;
    fn lost(&self) -> Receiver<()>;
    fn release_requested(&self) -> Receiver<ReleaseRequest>;
    /// Releases (deleting the key only if it is still ours) and reports the outcome.
    fn release(self: Box<Self>) -> etcd_sync::Result<()>;
}

/// The library's guards are one generic type, so one impl covers the three `lock` takes.
impl<K: GuardKind> LockGuard for Guard<K> {
    fn what(&self) -> &'static str {
        K::WHAT
    }
    fn key(&self) -> String {
        self.key_str().into_owned()
    }
    fn fencing_token(&self) -> i64 {
        Guard::fencing_token(self)
    }
    fn lost(&self) -> Receiver<()> {
        Guard::lost(self)
    }
    fn release_requested(&self) -> Receiver<ReleaseRequest> {
        Guard::release_requested(self)
    }
    fn release(self: Box<Self>) -> etcd_sync::Result<()> {
        Guard::release(*self)
    }
}

/// The primitive `lock` waits on, chosen by `-n` / `--shared` (clap lets at most one
/// through).
pub enum Lock {
    Exclusive(Mutex),
    Shared(RwLock),
    Permits(Semaphore),
}

impl Lock {
    pub fn new(session: &Session, args: &LockArgs) -> etcd_sync::Result<Lock> {
        let name = &args.name;
        Ok(match (args.permits, args.shared) {
            (Some(permits), _) => Lock::Permits(session.semaphore(name, permits)?),
            (None, true) => Lock::Shared(session.rwlock(name)?),
            (None, false) => Lock::Exclusive(session.mutex(name)?),
        })
    }

    /// Waits for the lock as `options` say (a limit: `Error::is_wait_timeout`; a
    /// cancelled token: `Error::Cancelled`).
    pub fn acquire(&self, options: WaitOptions) -> etcd_sync::Result<Box<dyn LockGuard>> {
        Ok(match self {
            Lock::Exclusive(mutex) => Box::new(mutex.lock_with(options)?),
            Lock::Shared(rwlock) => Box::new(rwlock.read_with(options)?),
            Lock::Permits(semaphore) => Box::new(semaphore.acquire_with(options)?),
        })
    }
}
