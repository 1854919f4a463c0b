//! What users hold, one folder per family as in `docs/`: the locks ([`locks`]:
//! [`Mutex`](locks::mutex::Mutex), [`RwLock`](locks::rwlock::RwLock),
//! [`Semaphore`](locks::semaphore::Semaphore), several locks at once
//! ([`MultiLock`](locks::multi_lock::MultiLock))), the [`election`]
//! ([`Election`](election::Election) with its [`Observer`](election::observe::Observer) and
//! [`LeaderLoop`](election::leader_loop::LeaderLoop)), the [`barriers`]
//! ([`Barrier`](barriers::barrier::Barrier),
//! [`DoubleBarrier`](barriers::double_barrier::DoubleBarrier),
//! [`CountDownLatch`](barriers::latch::CountDownLatch)) and software transactions
//! ([`stm`]). What the families share stays here: their guards (one generic
//! [`Guard`](guard::Guard)), the [`Status`](holder::Status) of a name and its read
//! ([`status`]), the requests to let go ([`revoke`]), and who waits for whom under a prefix
//! ([`wait_graph`]). Each lock recipe and the election are a thin layer over
//! [`ownership`](crate::ownership); software transactions need no session and no line,
//! only the client's reads and Txns; the barriers wait on the client's watch stream
//! directly.

pub(crate) mod barriers;
pub(crate) mod election;
pub(crate) mod guard;
pub(crate) mod holder;
pub(crate) mod locks;
pub(crate) mod revoke;
pub(crate) mod status;
pub(crate) mod stm;
pub(crate) mod wait_graph;
