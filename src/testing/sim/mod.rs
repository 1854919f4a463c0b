//! A simulated etcd cluster in this process (feature `simulation`, issue 29).
//!
//! [`SimCluster`] serves etcd's KV, Watch, Lease and Maintenance gRPC services from one
//! in-memory store (an MVCC store with revisions, compaction, leases on the runtime's
//! clock, and watchers served as etcd 3.4 serves them, unsynced ones included), through
//! members that can be stopped, frozen, made learners, left without a leader (also after a
//! number of writes), or made to apply writes without answering, and a key that can flicker
//! around the writes that put it. The crate's client connects to it unchanged: its endpoints
//! dial in-memory pipes instead of TCP, and everything above the socket (HTTP/2, gRPC, the
//! client's retries and failover) is the code that speaks to real etcd.
//!
//! What the simulation is faithful to is measured, not assumed: `tests/sim_fidelity.rs`
//! runs the same scripted requests against a real etcd and a simulated one and compares
//! the answers. What it does not model: auth, TLS, membership changes, members that lag
//! behind the others (all members serve one store), and message loss other than what the
//! faults above give.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use etcd_sync::testing::sim::SimCluster;
//!
//! let cluster = SimCluster::start(3)?;
//! let client = etcd_sync::Client::connect(cluster.endpoints())?;
//! let session = client.session()?;
//! let guard = session.mutex("jobs")?.lock()?;
//! assert_eq!(cluster.keys("jobs/").len(), 1);
//! drop(guard);
//! assert!(cluster.keys("jobs/").is_empty());
//! # Ok(()) }
//! ```

mod after;
mod fidelity;
mod flicker;
mod lag;
mod leases;
mod loops;
mod run;
mod serve;
mod services;
mod store;
mod watchers;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::task::AbortHandle;

pub use after::{AfterWrites, TimedOut};
pub use fidelity::{PROGRESS_INTERVAL, transcript};
pub use run::{LOSS_BOUND, Mode, Mutation, Operation, Outcome, RunConfig, What, run, sleep};

use crate::transport::memory;
use serve::Connections;
use services::{Member, MemberState, Shared, State};

/// The etcd version a simulated member reports: a release with etcd #18089 (see
/// [`SimCluster::set_keeps_compacted_tombstones`], the start).
pub const SIMULATED_VERSION: &str = "3.4.33-sim";

/// The version a simulated member reports once it keeps the deletes at the compact
/// revision: the first 3.4 release with #18089's fix.
pub const SIMULATED_FIXED_VERSION: &str = "3.4.34-sim";

/// A simulated etcd cluster served in this process. Dropping it stops every member.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
/// assert_eq!(cluster.endpoints().len(), 1);
/// # Ok(()) }
/// ```
pub struct SimCluster {
    shared: Arc<Shared>,
    endpoints: Vec<String>,
    connections: Vec<Connections>,
    /// Accept loops (one per member, while it runs) and the cluster's own loops.
    tasks: Mutex<Vec<Option<AbortHandle>>>,
    background: Vec<AbortHandle>,
    handle: tokio::runtime::Handle,
    /// The runtime thread of a cluster that serves itself ([`SimCluster::start`]).
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for SimCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCluster")
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

/// Distinguishes the clusters of one process (their endpoints must differ).
static NEXT_CLUSTER: AtomicU64 = AtomicU64::new(1);

impl SimCluster {
    /// Starts a cluster of `members` members (at least 1) with a leader, served by a
    /// runtime thread of its own.
    ///
    /// # Errors
    ///
    /// The runtime thread could not be started, or `members` is 0.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(3)?;
    /// assert_eq!(cluster.leader(), Some(0));
    /// # Ok(()) }
    /// ```
    pub fn start(members: usize) -> std::io::Result<SimCluster> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("etcd-sim")
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        SimCluster::build(members, handle, Some(runtime))
    }

    /// A cluster served by the runtime of the calling task (a simulated run's: see
    /// [`run`]).
    pub(crate) fn start_here(members: usize) -> std::io::Result<SimCluster> {
        SimCluster::build(members, tokio::runtime::Handle::current(), None)
    }

    fn build(
        members: usize,
        handle: tokio::runtime::Handle,
        runtime: Option<tokio::runtime::Runtime>,
    ) -> std::io::Result<SimCluster> {
        if members == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a cluster needs at least one member",
            ));
        }
        let number = NEXT_CLUSTER.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                store: store::Store::new(),
                leases: leases::Leases::new(),
                watchers: watchers::Watchers::default(),
                members: (0..members)
                    .map(|i| MemberState {
                        id: 0x8e9e_05c5_2164_6940 + i as u64,
                        up: true,
                        frozen: false,
                        learner: false,
                        swallow_writes: false,
                        late_writes: None,
                        lag: None,
                        read_wait: None,
                    })
                    .collect(),
                leader: Some(0),
                raft_term: 2,
                unsynced_every: 0,
                from_now: 0,
                progress_interval: None,
                applied: lag::Applied::default(),
                flicker: None,
                after_writes: Default::default(),
            }),
            cluster_id: 0xcdf8_1819_4e3a_8c32 ^ number,
            thawed: tokio::sync::Notify::new(),
        });
        let endpoints = (0..members)
            .map(|i| format!("http://m{i}.c{number}.sim.invalid:2379"))
            .collect();
        let background = vec![
            handle.spawn(loops::sync(shared.clone())).abort_handle(),
            handle.spawn(loops::expiry(shared.clone())).abort_handle(),
            handle.spawn(loops::progress(shared.clone())).abort_handle(),
        ];
        let cluster = SimCluster {
            shared,
            endpoints,
            connections: (0..members).map(|_| Connections::default()).collect(),
            tasks: Mutex::new(vec![None; members]),
            background,
            handle,
            runtime,
        };
        for i in 0..members {
            cluster.serve(i);
        }
        Ok(cluster)
    }

    /// Starts member `i`'s accept loop.
    fn serve(&self, i: usize) {
        let accepted = memory::listen(authority(&self.endpoints[i]));
        let member = Member {
            shared: self.shared.clone(),
            index: i,
        };
        let task = self
            .handle
            .spawn(serve::accept(member, accepted, self.connections[i].clone()));
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = tasks[i].replace(task.abort_handle()) {
            old.abort();
        }
    }

    /// The members' endpoints, for [`Client::connect`](crate::Client::connect).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(2)?;
    /// assert!(cluster.endpoints()[1].starts_with("http://m1."));
    /// # Ok(()) }
    /// ```
    pub fn endpoints(&self) -> Vec<String> {
        self.endpoints.clone()
    }

    /// The store's newest revision.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// assert_eq!(cluster.revision(), 1);
    /// # Ok(()) }
    /// ```
    pub fn revision(&self) -> i64 {
        self.shared.lock().store.revision()
    }

    /// The live keys starting with `prefix`, with their create revisions, in key order
    /// (what a test checks its verdicts against, without a request).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// assert!(cluster.keys("").is_empty());
    /// # Ok(()) }
    /// ```
    pub fn keys(&self, prefix: &str) -> Vec<(String, i64)> {
        keys_under(&self.shared.lock(), prefix)
    }

    /// Compacts the history up to the newest revision, as an operator or etcd's
    /// auto-compaction does; returns that revision.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// let client = etcd_sync::Client::connect(cluster.endpoints())?;
    /// client.put("k", "v")?;
    /// assert_eq!(cluster.compact(), 2);
    /// # Ok(()) }
    /// ```
    pub fn compact(&self) -> i64 {
        let mut state = self.shared.lock();
        let revision = state.store.revision();
        let _ = state.store.compact(revision);
        revision
    }

    /// Deletes every key starting with `prefix`, as an operator's `etcdctl del --prefix`
    /// does; returns how many were deleted.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// assert_eq!(cluster.delete_prefix("jobs/"), 0);
    /// # Ok(()) }
    /// ```
    pub fn delete_prefix(&self, prefix: &str) -> usize {
        let mut state = self.shared.lock();
        let keys: Vec<Vec<u8>> = keys_under(&state, prefix)
            .into_iter()
            .map(|(key, _)| key.into_bytes())
            .collect();
        let changes = state.store.delete_keys(&keys);
        let revision = state.store.revision();
        state.watchers.notify(&changes, revision);
        keys.len()
    }

    /// Revokes a lease now, as `etcdctl lease revoke` does (its keys go in one revision);
    /// false if there was none.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// assert!(!cluster.revoke(42));
    /// # Ok(()) }
    /// ```
    pub fn revoke(&self, lease: i64) -> bool {
        services::revoke(&mut self.shared.lock(), lease, false)
    }

    /// Leaves a lease's keep-alives unanswered from now on, as for a holder cut off one
    /// way: it expires at its deadline, keys and all. False if there is none.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// assert!(!cluster.starve(42));
    /// # Ok(()) }
    /// ```
    pub fn starve(&self, lease: i64) -> bool {
        self.shared.lock().leases.starve(lease)
    }

    /// The member that leads, if any.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// assert_eq!(cluster.leader(), Some(0));
    /// # Ok(()) }
    /// ```
    pub fn leader(&self) -> Option<usize> {
        self.shared.lock().leader
    }

    /// Sets the leader (`None`: the cluster has lost its quorum, and every member refuses
    /// with "etcdserver: no leader"). A new leader starts a new term and restarts every
    /// lease's TTL, as etcd's does.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(3)?;
    /// cluster.set_leader(None);
    /// cluster.set_leader(Some(2));
    /// assert_eq!(cluster.leader(), Some(2));
    /// # Ok(()) }
    /// ```
    pub fn set_leader(&self, leader: Option<usize>) {
        let mut state = self.shared.lock();
        if leader.is_some() && leader != state.leader {
            state.raft_term += 1;
            state.leases.restart_all(tokio::time::Instant::now());
        }
        state.leader = leader;
    }

    /// Stops member `i` (`false`): its connections are cut and new ones refused, as for a
    /// killed process; or starts it again (`true`).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(3)?;
    /// cluster.set_up(1, false);
    /// cluster.set_up(1, true);
    /// # Ok(()) }
    /// ```
    pub fn set_up(&self, i: usize, up: bool) {
        if i >= self.endpoints.len() {
            return;
        }
        self.shared.lock().members[i].up = up;
        if up {
            self.serve(i);
        } else {
            memory::unlisten(authority(&self.endpoints[i]));
            if let Some(task) = self.tasks.lock().unwrap_or_else(|e| e.into_inner())[i].take() {
                task.abort();
            }
            serve::cut(&self.connections[i]);
        }
    }

    /// Cuts member `i`'s connections (its watch and keep-alive streams break); it goes on
    /// accepting new ones.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// cluster.break_connections(0);
    /// # Ok(()) }
    /// ```
    pub fn break_connections(&self, i: usize) {
        if let Some(connections) = self.connections.get(i) {
            serve::cut(connections);
        }
    }

    /// Freezes member `i` (`true`): it takes requests and answers none until thawed.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// cluster.set_frozen(0, true);
    /// cluster.set_frozen(0, false);
    /// # Ok(()) }
    /// ```
    pub fn set_frozen(&self, i: usize, frozen: bool) {
        self.member(i, |m| m.frozen = frozen);
        if !frozen {
            self.shared.thawed.notify_waiters();
        }
    }

    /// Makes member `i` a learner (`true`): it answers Status and refuses the rest.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(2)?;
    /// cluster.set_learner(1, true);
    /// # Ok(()) }
    /// ```
    pub fn set_learner(&self, i: usize, learner: bool) {
        self.member(i, |m| m.learner = learner);
    }

    /// Makes member `i` apply writes without ever answering them (`true`): the client's
    /// request times out although its write happened.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// cluster.set_swallow_writes(0, true);
    /// # Ok(()) }
    /// ```
    pub fn set_swallow_writes(&self, i: usize, swallow: bool) {
        self.member(i, |m| m.swallow_writes = swallow);
    }

    /// Makes member `i` apply each write `delay` after it arrives, and never answer it
    /// (`None`: on time). With a delay past the client's request timeout, the client
    /// retries elsewhere first, and the first attempt applies after: a late write.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// cluster.set_late_writes(0, Some(std::time::Duration::from_secs(2)));
    /// cluster.set_late_writes(0, None);
    /// # Ok(()) }
    /// ```
    pub fn set_late_writes(&self, i: usize, delay: Option<std::time::Duration>) {
        self.member(i, |m| m.late_writes = delay);
    }

    /// Registers every `n`-th new watcher from "now" as unsynced (0: none), as etcd does
    /// when a write lands while it registers one: its events then come on the next
    /// catch-up round, up to 100 ms late.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// cluster.set_unsynced_every(3);
    /// # Ok(()) }
    /// ```
    pub fn set_unsynced_every(&self, n: u64) {
        self.shared.lock().unsynced_every = n;
    }

    /// Puts member `i` behind the leader by `lag` (`None`: caught up again): it serves
    /// every request that much later, its watchers' events come that much late, and its
    /// serializable reads see the store as it was then.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(3)?;
    /// cluster.set_lag(1, Some(std::time::Duration::from_millis(300)));
    /// cluster.set_lag(1, None);
    /// # Ok(()) }
    /// ```
    pub fn set_lag(&self, i: usize, lag: Option<std::time::Duration>) {
        if let Some(member) = self.shared.lock().members.get_mut(i) {
            member.lag = lag;
        }
    }

    /// Whether compaction keeps a delete at exactly the compact revision (etcd 3.4.34,
    /// 3.5.15 and later) or drops it, so that a watcher starting there never gets it (the
    /// start: etcd #18089, as Debian's 3.4.23 and PyPI's 3.5.1 do).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// cluster.set_keeps_compacted_tombstones(true);
    /// # Ok(()) }
    /// ```
    pub fn set_keeps_compacted_tombstones(&self, keeps: bool) {
        // Status says which (a client trusts a member with the fix to resume watchers
        // right after what they have).
        self.shared.lock().store.keeps_compacted_tombstones = keeps;
    }

    /// Makes every member send timed progress notifications this often to the watchers
    /// that ask for them (etcd's `--experimental-watch-progress-notify-interval`; `None`,
    /// the start: never within a run, as etcd's 10 minutes).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// cluster.set_progress_interval(Some(std::time::Duration::from_millis(500)));
    /// # Ok(()) }
    /// ```
    pub fn set_progress_interval(&self, interval: Option<std::time::Duration>) {
        self.shared.lock().progress_interval = interval;
    }

    /// How many watchers the members serve, and how many of them are unsynced.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// assert_eq!(cluster.watchers(), (0, 0));
    /// # Ok(()) }
    /// ```
    pub fn watchers(&self) -> (usize, usize) {
        self.shared.lock().watchers.count()
    }

    /// How many watchers were told their start revision was compacted.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// assert_eq!(cluster.compacted_watchers(), 0);
    /// # Ok(()) }
    /// ```
    pub fn compacted_watchers(&self) -> u64 {
        self.shared.lock().watchers.compacted
    }

    /// How many progress notifications the members sent.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
    /// assert_eq!(cluster.progress_notifications(), 0);
    /// # Ok(()) }
    /// ```
    pub fn progress_notifications(&self) -> u64 {
        self.shared.lock().watchers.progress_sent
    }

    fn member(&self, i: usize, change: impl FnOnce(&mut MemberState)) {
        if let Some(member) = self.shared.lock().members.get_mut(i) {
            change(member);
        }
    }
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        for endpoint in &self.endpoints {
            memory::unlisten(authority(endpoint));
        }
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .flatten()
        {
            task.abort();
        }
        for task in &self.background {
            task.abort();
        }
        for connections in &self.connections {
            serve::cut(connections);
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The authority part of one of our endpoints.
fn authority(url: &str) -> &str {
    url.trim_start_matches("http://")
}

/// The live keys starting with `prefix` (every key for an empty one), with their create
/// revisions, in key order.
fn keys_under(state: &State, prefix: &str) -> Vec<(String, i64)> {
    let range = crate::transport::generated::etcdserverpb::RangeRequest {
        key: if prefix.is_empty() {
            vec![0]
        } else {
            prefix.as_bytes().to_vec()
        },
        range_end: crate::support::kv::prefix_end(prefix.as_bytes()),
        keys_only: true,
        ..Default::default()
    };
    state
        .store
        .range(&range)
        .map(|r| {
            r.kvs
                .into_iter()
                .map(|kv| {
                    (
                        String::from_utf8_lossy(&kv.key).into_owned(),
                        kv.create_revision,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}
