//! What users hold: [`Mutex`](mutex::Mutex), [`RwLock`](rwlock::RwLock),
//! [`Semaphore`](semaphore::Semaphore), several locks at once
//! ([`MultiLock`](multi_lock::MultiLock)), [`Election`](election::Election) with its
//! [`Observer`](observe::Observer) and [`LeaderLoop`](leader_loop::LeaderLoop), their
//! guards (one generic [`Guard`](guard::Guard)), and the [`Status`](holder::Status) of a
//! name. Each recipe is a thin layer over
//! [`ownership`](crate::ownership), but software transactions ([`stm`]), which need no
//! session and no line: only the client's reads and Txns.

pub(crate) mod election;
pub(crate) mod guard;
pub(crate) mod holder;
pub(crate) mod leader_loop;
pub(crate) mod multi_lock;
pub(crate) mod mutex;
pub(crate) mod observe;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
pub(crate) mod status;
pub(crate) mod stm;
