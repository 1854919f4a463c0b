//! The barriers (`docs/barriers.md`): [`Barrier`](barrier::Barrier),
//! [`CountDownLatch`](latch::CountDownLatch) and
//! [`DoubleBarrier`](double_barrier::DoubleBarrier). They need no line: each waits on the
//! client's watch stream directly, the first two for one key's absence (`gone.rs`).

pub(crate) mod barrier;
pub(crate) mod double_barrier;
pub(crate) mod gone;
pub(crate) mod latch;
