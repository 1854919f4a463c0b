//! What users hold: [`Mutex`](mutex::Mutex), [`RwLock`](rwlock::RwLock),
//! [`Semaphore`](semaphore::Semaphore), several locks at once
//! ([`MultiLock`](multi_lock::MultiLock)), [`Election`](election::Election) with its
//! [`Observer`](observe::Observer) and [`LeaderLoop`](leader_loop::LeaderLoop), their
//! guards (one generic [`Guard`](guard::Guard)), and the [`Status`](holder::Status) of a
//! name. Each lock recipe is a thin layer over
//! [`ownership`](crate::ownership); software transactions ([`stm`]) need no session and no
//! line, only the client's reads and Txns; the barriers ([`Barrier`](barrier::Barrier),
//! [`DoubleBarrier`](double_barrier::DoubleBarrier),
//! [`CountDownLatch`](latch::CountDownLatch)) wait on the client's watch stream directly.

pub(crate) mod barrier;
pub(crate) mod double_barrier;
pub(crate) mod election;
pub(crate) mod gone;
pub(crate) mod guard;
pub(crate) mod holder;
pub(crate) mod latch;
pub(crate) mod leader_loop;
pub(crate) mod multi_lock;
pub(crate) mod mutex;
pub(crate) mod observe;
pub(crate) mod revoke;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
pub(crate) mod status;
pub(crate) mod stm;
