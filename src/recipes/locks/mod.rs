//! The locks (`docs/locks.md`): [`Mutex`](mutex::Mutex), [`RwLock`](rwlock::RwLock),
//! [`Semaphore`](semaphore::Semaphore) and several names at once
//! ([`MultiLock`](multi_lock::MultiLock)), each a thin layer over
//! [`ownership`](crate::ownership) with its guard an alias of the shared
//! [`Guard`](crate::recipes::guard::Guard).

pub(crate) mod multi_lock;
pub(crate) mod mutex;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
