//! Who waits for whom under a prefix, as [`Client::wait_graph`] reports it: plain data,
//! built in `mod.rs` from one read, with the cycles found in `cycles.rs`.

use std::borrow::Cow;
use std::time::Duration;

// `Client` names the method in the docs' links.
#[cfg(doc)]
use crate::client::Client;
use crate::recipes::holder::{Holder, Status};
use crate::support::error::cycle::Cycle;
use crate::support::kv::text;

/// Which session (lease) holds which names under a prefix and which names it waits for,
/// and the cycles among them: sessions that wait for each other and so can never go on.
/// From [`Client::wait_graph`], one read of the prefix and one lease lookup per lease.
///
/// A session is a lease: every key of a [`Session`](crate::Session), of `etcdctl lock`
/// or of Go's `concurrency.Session` is bound to its lease, so the keys of one process's
/// session, under every name, belong to one [`Participant`]. Keys without a lease (data
/// under a name, written by hand) are gathered under the lease 0.
///
/// **How long.** etcd keeps no time with a key, only the revision that created it, so one
/// read cannot say how long anyone has waited. What the graph gives instead: each wait's
/// place in its line ([`Place::position`]), its create revision (older waits have lower
/// ones; [`revision`](WaitGraph::revision) − create revision is how many writes etcd has
/// taken since, anywhere in the cluster), and each session's lease TTL, left and granted:
/// a holder that died keeps its names for at most its granted TTL. (A lease's granted TTL
/// minus what is left is the time since its last renewal, not a wait.) `etcd-sync top`
/// measures waits itself, from the first refresh that saw each one.
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let graph = client.wait_graph("jobs/")?;
/// for p in &graph.participants {
///     for wait in &p.waits {
///         println!(
///             "{} waits for {} ({} ahead), held by {:x?}",
///             p.identity.as_deref().unwrap_or("?"),
///             wait.name_str(),
///             wait.position,
///             wait.blocked_by,
///         );
///     }
/// }
/// for cycle in &graph.cycles {
///     println!("deadlock: {cycle}");
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitGraph {
    /// The prefix read.
    pub prefix: Vec<u8>,
    /// The store revision of the read.
    pub revision: i64,
    /// Every name under the prefix with at least one lock key (`<name>/<lease hex>[suffix]`),
    /// sorted by name: its line as [`Client::status`] reports it.
    pub names: Vec<Status>,
    /// Every lease seen in those lines, sorted by lease id (0, keys without a lease, first).
    pub participants: Vec<Participant>,
    /// The cycles of waits: each a ring of sessions, every one waiting for a name the next
    /// one is ahead of it in. Empty when no session is stuck in a cycle.
    pub cycles: Vec<Cycle>,
}

impl WaitGraph {
    /// The participant of `lease`, if the graph saw it.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let session = client.session()?;
    /// let graph = client.wait_graph("jobs/")?;
    /// if let Some(me) = graph.participant(session.lease_id()) {
    ///     println!("I hold {} names", me.holds.len());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn participant(&self, lease: i64) -> Option<&Participant> {
        self.participants
            .binary_search_by_key(&lease, |p| p.lease)
            .ok()
            .map(|i| &self.participants[i])
    }

    /// Every edge "`waiter` waits for `name`, which `holder` holds", as
    /// `(waiter lease, name, holder lease)`, in participant order.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// for (waiter, name, holder) in client.wait_graph("")?.edges() {
    ///     println!("{waiter:x} -> {holder:x} ({})", String::from_utf8_lossy(name));
    /// }
    /// # Ok(()) }
    /// ```
    pub fn edges(&self) -> impl Iterator<Item = (i64, &[u8], i64)> + '_ {
        self.participants.iter().flat_map(|p| {
            p.waits.iter().flat_map(move |wait| {
                wait.blocked_by
                    .iter()
                    .map(move |&holder| (p.lease, wait.name.as_slice(), holder))
            })
        })
    }
}

/// One session (lease) of a [`WaitGraph`]: what it holds, what it waits for.
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// for p in client.wait_graph("jobs/")?.participants {
///     let held: Vec<_> = p.holds.iter().map(|h| h.name_str().into_owned()).collect();
///     println!("{:x} ({:?} left of {:?}) holds {held:?}", p.lease, p.ttl, p.granted_ttl);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Participant {
    /// The lease; 0 gathers the keys that have none.
    pub lease: i64,
    /// The value of its oldest lock key with a value: the identity of a session of this
    /// crate ([`Session::identity`](crate::Session::identity)), or the value an election
    /// candidate campaigned with. `None` when every key of it is empty (`etcdctl lock`,
    /// Go's `Mutex`).
    pub identity: Option<String>,
    /// What etcd said was left of the lease's TTL, in whole seconds; `None` for the lease
    /// 0 or a lease that ended after the read.
    pub ttl: Option<Duration>,
    /// The TTL the lease was granted: how long etcd keeps its keys once nobody renews it.
    pub granted_ttl: Option<Duration>,
    /// The names it holds, one place per key, by name.
    pub holds: Vec<Place>,
    /// The names it waits for, one place per lock key that does not hold, by name. A key
    /// that is not a lock key behind a holder (data under a name) waits for nothing and is
    /// not listed here (it is in [`WaitGraph::names`]).
    pub waits: Vec<Place>,
    /// Whether some wait of it can never end: even if every session that can go on did,
    /// and then let go of everything, this one would still wait. That is so for every
    /// session of a [`Cycle`], for any that waits behind one, and for any that waits
    /// behind a key without a lease.
    pub stuck: bool,
}

/// One key of a [`Participant`] in a name's line: a hold or a wait.
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// for p in client.wait_graph("jobs/")?.participants {
///     for wait in &p.waits {
///         println!("{}: {} keys ahead, token {}", wait.name_str(), wait.position, wait.key.create_revision);
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The name (the key is under `<name>/`).
    pub name: Vec<u8>,
    /// The key, as [`Client::status`] reports it.
    pub key: Holder,
    /// How many keys are ahead of it in the name's line (0 for the oldest holder).
    pub position: usize,
    /// For a wait, the leases that hold the name now, each once (0 for a holder key
    /// without a lease), in line order; empty for a hold.
    pub blocked_by: Vec<i64>,
}

impl Place {
    /// The name as text (invalid UTF-8 replaced).
    ///
    /// ```
    /// # use etcd_sync::{Holder, KeyMode, Place};
    /// let key = Holder { key: b"jobs/694d".to_vec(), value: vec![], lease: 0x694d, create_revision: 7, mod_revision: 7, mode: KeyMode::Exclusive, ttl: None };
    /// let place = Place { name: b"jobs".to_vec(), key, position: 0, blocked_by: vec![] };
    /// assert_eq!(place.name_str(), "jobs");
    /// ```
    pub fn name_str(&self) -> Cow<'_, str> {
        text(&self.name)
    }
}
