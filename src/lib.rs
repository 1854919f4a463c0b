//! # etcd-sync
//!
//! Distributed synchronization on etcd v3 for ordinary, non-async Rust, in the style of
//! `std::sync`: a [`Mutex`] whose guard releases on `Drop`, leader election with a
//! [`Leadership`] guard, and the [`Session`]s (leases) under them.
//!
//! ```no_run
//! # fn main() -> etcd_sync::Result<()> {
//! let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
//! let session = client.session()?;
//! let mutex = session.mutex("migrations")?;
//! let guard = mutex.lock()?;
//! // ... run the migration; guard.fencing_token() stamps writes elsewhere ...
//! drop(guard); // released
//! # Ok(()) }
//! ```
//!
//! * The crate speaks etcd's gRPC API itself; a private tokio runtime does the I/O and never
//!   shows in the API. Calling a blocking method on an async worker thread returns
//!   [`Error::InsideAsyncRuntime`] instead of panicking; `spawn_blocking` threads may call it.
//! * Keys and transactions are those of etcd's Go `concurrency` package
//!   (`<name>/<lease id in hex>`, oldest create revision owns), so a lock taken here excludes
//!   `etcdctl lock` on the same name, and the other way round.
//! * A session is declared lost *before* etcd can expire its lease (see [`Session`]); guards
//!   carry a fencing token and can make writes conditional on still holding the lock.
//!
//! * [`Client::stm`] runs a closure as a software transaction (Go's `concurrency.NewSTM`,
//!   with its [`Isolation`] levels): one Txn commits its writes if what it read is
//!   unchanged, else it runs again.
//!
//! * Barriers: a [`Barrier`] that holds everyone until it is released, a [`DoubleBarrier`]
//!   whose participants enter and leave together (one whose session ends is counted out),
//!   and a [`CountDownLatch`]; their waits take the same limits and
//!   [`CancelToken`]s as the locks'.
//!
//! * Notifications (a guard's [`lost()`](MutexGuard::lost), a session's
//!   [`lost()`](Session::lost), an [`Observer`]'s [`receiver()`](Observer::receiver)) are
//!   [`crossbeam_channel`] receivers, re-exported here, so they sit together in one
//!   [`select!`](crossbeam_channel::select) with your own channels.
//!
//! Optional features: `tls` (https endpoints, client certificates), `cli` (the `etcd-sync`
//! command-line tool), `testing` (start real etcd servers from tests), `metrics` (wait and
//! hold times, losses, failovers through the `metrics` facade; names in `metric_names`).
//!
//! See `ARCHITECTURE.md` for threads and request flow.
#![warn(missing_docs)]
// Time is read through `support::clock` only (clippy.toml says why).
#![warn(clippy::disallowed_methods)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub(crate) mod client;
pub(crate) mod line;
pub(crate) mod ownership;
pub(crate) mod recipes;
pub(crate) mod session;
pub(crate) mod support;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
#[allow(clippy::disallowed_methods)] // It runs and waits for real processes.
pub mod testing;
pub(crate) mod transport;

pub use client::Client;
pub use client::builder::{
    ClientBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, MAX_KEEP_ALIVE_INTERVAL,
    MAX_TIMEOUT, MIN_KEEP_ALIVE_INTERVAL,
};
/// The channel crate whose receivers this crate hands out (`lost()`, [`Observer::receiver`]),
/// re-exported so that `select!` needs no version guessing.
pub use crossbeam_channel;
pub use line::mode::MAX_PERMITS;
pub use line::request::ReleaseRequest;
pub use ownership::MAX_LOCK_DELAY;
pub use recipes::barriers::barrier::Barrier;
pub use recipes::barriers::double_barrier::DoubleBarrier;
pub use recipes::barriers::latch::CountDownLatch;
pub use recipes::election::leader_loop::health::{LoopHealth, LoopState, TermEnd};
pub use recipes::election::leader_loop::{DEFAULT_LOOP_BACKOFF, DEFAULT_WEDGED_AFTER, LeaderLoop};
pub use recipes::election::observe::{LeaderEvent, Observer};
pub use recipes::election::{Election, Leadership};
pub use recipes::guard::{
    Guard, GuardKind, LeaderKind, MutexKind, PermitKind, ReadKind, WriteKind,
};
pub use recipes::holder::{Holder, KeyMode, Status};
pub use recipes::locks::multi_lock::{
    MAX_MULTI_LOCK_NAMES, MultiLock, MultiLockGuard, MultiLockMember,
};
pub use recipes::locks::mutex::{Mutex, MutexGuard};
pub use recipes::locks::rwlock::{DowngradeError, RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use recipes::locks::semaphore::{Permit, Semaphore};
pub use recipes::revoke::MAX_REASON_LEN;
pub use recipes::stm::tx::StmTx;
pub use recipes::stm::{Isolation, StmBuilder};
pub use recipes::wait_graph::graph::{Participant, Place, WaitGraph};
pub use session::{DEFAULT_TTL, MAX_TTL, Session, SessionBuilder};
pub use support::cancel::{CancelToken, WaitOptions};
pub use support::error::code::Code;
pub use support::error::cycle::{Cycle, CycleStep};
pub use support::error::loss::LossReason;
pub use support::error::operation::Operation;
pub use support::error::try_lock::TryLockError;
pub use support::error::{Cause, Error, Result};
pub use support::identity::MAX_IDENTITY_LEN;
pub use support::kv::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse};
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use support::telemetry::names as metric_names;
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub use support::tls::TlsConfig;

/// The README's snippets, compiled as doc tests so that the front page never shows code
/// that does not build (one of them uses `testing`).
#[cfg(all(doctest, feature = "testing"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
