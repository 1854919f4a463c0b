//! [`Cycle`]: sessions that wait for each other, as the wait graph reports them
//! (`recipes/wait_graph/`) and as a [`Deadlock`](super::Error::Deadlock) error names them.

use std::borrow::Cow;

use crate::support::kv::text;

/// Sessions that wait for each other: each step's session waits for a name that the next
/// step's session (the first after the last) is ahead of it in, so none of them can go
/// on while each keeps what it holds until its waits end. A cross-process deadlock: A
/// holds x and waits for y, B holds y and waits for x.
///
/// Found in the line as it will be once every session that can go on has done so and let
/// go of all it holds; in the simplest case, the line as it is: the next session holds the
/// name. A session that waits on two threads, one of which holds a name the other does
/// not need, may still let go of it: the graph cannot tell threads apart, only sessions.
///
/// Reported by [`Client::wait_graph`](crate::Client::wait_graph), and by the
/// [`Deadlock`](crate::Error::Deadlock) error of a wait that would complete one (opt in
/// with [`ClientBuilder::deadlock_detection`](crate::ClientBuilder::deadlock_detection)).
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let graph = client.wait_graph("")?;
/// for cycle in &graph.cycles {
///     for step in &cycle.steps {
///         let who = step.identity.as_deref().unwrap_or("?");
///         println!("{:x} ({who}) waits for {} held by {:x}", step.lease, step.name_str(), step.holder);
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// The ring, starting with its lowest lease; one step per session.
    pub steps: Vec<CycleStep>,
}

impl Cycle {
    /// The leases of the ring, in its order.
    ///
    /// ```
    /// # use etcd_sync::{Cycle, CycleStep};
    /// let cycle = Cycle { steps: vec![
    ///     CycleStep { lease: 1, name: b"x".to_vec(), holder: 2, identity: None },
    ///     CycleStep { lease: 2, name: b"y".to_vec(), holder: 1, identity: None },
    /// ] };
    /// assert_eq!(cycle.leases().collect::<Vec<_>>(), [1, 2]);
    /// ```
    pub fn leases(&self) -> impl Iterator<Item = i64> + '_ {
        self.steps.iter().map(|step| step.lease)
    }
}

impl std::fmt::Display for Cycle {
    /// `1a waits for x held by 2b; 2b waits for y held by 1a` (leases in hex), each
    /// waiting session followed by its identity in parentheses when one is known.
    ///
    /// ```
    /// # use etcd_sync::{Cycle, CycleStep};
    /// let cycle = Cycle { steps: vec![
    ///     CycleStep { lease: 0x1a, name: b"x".to_vec(), holder: 0x2b, identity: None },
    ///     CycleStep { lease: 0x2b, name: b"y".to_vec(), holder: 0x1a, identity: Some("host-b".into()) },
    /// ] };
    /// assert_eq!(cycle.to_string(), "1a waits for x held by 2b; 2b (host-b) waits for y held by 1a");
    /// ```
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, step) in self.steps.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{:x}", step.lease)?;
            if let Some(identity) = &step.identity {
                write!(f, " ({identity})")?;
            }
            write!(
                f,
                " waits for {} held by {:x}",
                step.name_str(),
                step.holder
            )?;
        }
        Ok(())
    }
}

/// One session of a [`Cycle`] and the name it waits for.
///
/// ```
/// let step = etcd_sync::CycleStep { lease: 0x694d, name: b"x".to_vec(), holder: 0x694e, identity: None };
/// assert_eq!(step.name_str(), "x");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CycleStep {
    /// The waiting session's lease.
    pub lease: i64,
    /// The name it waits for.
    pub name: Vec<u8>,
    /// The lease of the next session of the ring, ahead of it in `name`.
    pub holder: i64,
    /// Who waits: the value of its waiting key in `name` (a session's
    /// [`identity`](crate::Session::identity), an election candidate's value); `None` when
    /// that key is empty (`etcdctl lock`, Go's `Mutex`) or not valid UTF-8. In a
    /// [`WaitGraph`](crate::WaitGraph), the participant's identity.
    pub identity: Option<String>,
}

impl CycleStep {
    /// The name as text (invalid UTF-8 replaced).
    ///
    /// ```
    /// let step = etcd_sync::CycleStep { lease: 1, name: b"jobs".to_vec(), holder: 2, identity: None };
    /// assert_eq!(step.name_str(), "jobs");
    /// ```
    pub fn name_str(&self) -> Cow<'_, str> {
        text(&self.name)
    }
}
