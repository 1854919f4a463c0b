//! Real network partitions on loopback: packets between the test's clients and the members,
//! or between members, dropped or reset by nftables rules, inside a private network
//! namespace that the test made for itself (see `netns.rs`).
//!
//! How packets are told apart: member `i` listens on its own address `127.0.0.(i+2)` and
//! runs as its own user id; a `postrouting` NAT rule gives every connection that member
//! dials the source address `127.0.0.(i+2)` too (by `meta skuid`). The test's own
//! connections come from `127.0.0.1`. A fault is a base chain on the `input` hook whose rules
//! match the sender and receiver of each packet; deleting the chain heals it.

use std::fmt::Write as _;
use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::cluster::EtcdCluster;
use super::netns;
use super::start::EtcdClusterBuilder;

/// The nftables table (family `ip`) holding the NAT rules and every fault.
const TABLE: &str = "etcd_sync_faults";
/// Members a [`NetFaults`] can place: one address and one user id each.
const MAX_MEMBERS: usize = 16;
/// Member `i` runs as user id `UID_BASE + i` (ids no account is expected to have).
const UID_BASE: u32 = 7_770_000;
/// The address the test's own connections come from.
const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// One end of a link: the test process's clients, or a member of the cluster (by index).
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::Node;
///
/// let holder_side = [Node::Client];
/// let members = [Node::Member(0), Node::Member(1)];
/// # let _ = (holder_side, members);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    /// Every client of the test process (they all connect from `127.0.0.1`). Only their
    /// traffic with the members' client ports is cut: health and metrics checks of the
    /// harness go on working.
    Client,
    /// Member `i` of the cluster.
    Member(usize),
}

/// What happens to a cut packet.
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::Fault;
///
/// for fault in [Fault::BlackHole, Fault::Reset] {
///     println!("{fault:?}");
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Dropped without a word (`drop`): the sender retransmits and its pings time out.
    BlackHole,
    /// Answered with a TCP reset to its sender (`reject with tcp reset`): the sender's
    /// connection fails at once; the receiver hears nothing.
    Reset,
}

impl Fault {
    fn verdict(self) -> &'static str {
        match self {
            Fault::BlackHole => "drop",
            Fault::Reset => "reject with tcp reset",
        }
    }
}

/// Network faults for one test, in a private network namespace it runs in: see
/// [`NetFaults::enter`]. Start the cluster from [`cluster_builder`](Self::cluster_builder),
/// then [`cut`](Self::cut) links and [`heal`](Cut::heal) them.
///
/// Needs Linux, root, `unshare` (util-linux), `ip` (iproute2) and `nft` (nftables). Every
/// firewall change first checks that the process is not in the network namespace it was
/// started in, so the machine's own firewall is never touched.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use etcd_sync::testing::{Fault, NetFaults, Node};
///
/// // In a #[test] fn named `partitioned_member`:
/// let Some(net) = NetFaults::enter("partitioned_member", Duration::from_secs(120))? else {
///     return Ok(()); // the test ran (and passed) in its own namespace
/// };
/// let cluster = net.cluster_builder(3)?.start()?;
/// let cut = net.cut_both(&cluster, &[Node::Member(0)], &[Node::Member(1), Node::Member(2)],
///     Fault::BlackHole)?;
/// // ... member 0 is alone ...
/// cut.heal()?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct NetFaults {
    /// Numbers the chains of the cuts.
    next_cut: AtomicU64,
}

impl NetFaults {
    /// Runs the calling test in a private network namespace. Outside one, runs this test
    /// binary's test `test` again inside a new one (`unshare -n`, with `test` as an exact
    /// filter), prints its output, waits for it (at most `limit`, then kills it) and
    /// returns `Ok(None)` if it passed: the calling test then returns. Inside (the re-run),
    /// brings up the loopback interface, installs the NAT rules that tell members apart,
    /// and returns `Ok(Some(_))`: the calling test does its work.
    ///
    /// # Errors
    ///
    /// Outside: not root, `unshare`, `ip` or `nft` missing (the message says what to
    /// install), or the re-run failed, timed out, or did not run `test`. Inside: the
    /// namespace is not private, or `ip` or `nft` failed.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use etcd_sync::testing::NetFaults;
    ///
    /// #[test]
    /// fn my_partition_test() {
    ///     let Some(net) = NetFaults::enter("my_partition_test", Duration::from_secs(60))
    ///         .unwrap()
    ///     else {
    ///         return;
    ///     };
    ///     let cluster = net.cluster_builder(3).unwrap().start().unwrap();
    ///     # let _ = cluster;
    /// }
    /// ```
    pub fn enter(test: &str, limit: Duration) -> io::Result<Option<NetFaults>> {
        if !netns::inside() {
            netns::rerun_inside(test, limit)?;
            return Ok(None);
        }
        netns::set_up_inside()?;
        let mut script = format!(
            "add table ip {TABLE}\n\
             add chain ip {TABLE} member_sources {{ type nat hook postrouting priority srcnat; policy accept; }}\n"
        );
        for i in 0..MAX_MEMBERS {
            let _ = writeln!(
                script,
                "add rule ip {TABLE} member_sources meta skuid {} snat to {}",
                member_uid(i),
                member_address(i)
            );
        }
        netns::nft(&script)?;
        Ok(Some(NetFaults {
            next_cut: AtomicU64::new(0),
        }))
    }

    /// A cluster builder whose member `i` listens on `127.0.0.(i+2)` and runs as its own
    /// user id, as the cuts need; add flags and start it as usual.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for more than 16 members.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # let net: etcd_sync::testing::NetFaults = unimplemented!();
    /// let cluster = net.cluster_builder(3)?.arg("--heartbeat-interval=50").start()?;
    /// # let _ = cluster;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn cluster_builder(&self, members: usize) -> io::Result<EtcdClusterBuilder> {
        if members > MAX_MEMBERS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("NetFaults places at most {MAX_MEMBERS} members, not {members}"),
            ));
        }
        Ok(EtcdCluster::builder(members)
            .member_addresses((0..members).map(member_address))
            .member_uids((0..members).map(member_uid)))
    }

    /// Cuts one way: every packet from a node of `from` to a node of `to` meets `fault`,
    /// until the returned [`Cut`] is healed or dropped. Packets between a node and itself
    /// are left alone. A cut from [`Node::Client`] to member `i` stops what clients send
    /// to its client port (they hear its answers on connections they still have); from
    /// member `i` to [`Node::Client`], what it answers there.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if the cluster was not started from
    /// [`cluster_builder`](Self::cluster_builder) or names no such member; `nft`'s error.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use etcd_sync::testing::{Fault, Node};
    /// # let net: etcd_sync::testing::NetFaults = unimplemented!();
    /// let cluster = net.cluster_builder(3)?.start()?;
    /// // The client can send to member 0 but hears nothing back.
    /// let cut = net.cut(&cluster, &[Node::Member(0)], &[Node::Client], Fault::BlackHole)?;
    /// cut.heal()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn cut(
        &self,
        cluster: &EtcdCluster,
        from: &[Node],
        to: &[Node],
        fault: Fault,
    ) -> io::Result<Cut> {
        self.install(cluster, &[(from, to)], fault)
    }

    /// Cuts both ways between `a` and `b`: [`cut`](Self::cut) from `a` to `b` and from `b`
    /// to `a`, healed together.
    ///
    /// # Errors
    ///
    /// As [`cut`](Self::cut).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use etcd_sync::testing::{Fault, Node};
    /// # let net: etcd_sync::testing::NetFaults = unimplemented!();
    /// let cluster = net.cluster_builder(3)?.start()?;
    /// let majority = [Node::Member(1), Node::Member(2)];
    /// let cut = net.cut_both(&cluster, &[Node::Member(0)], &majority, Fault::Reset)?;
    /// cut.heal()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn cut_both(
        &self,
        cluster: &EtcdCluster,
        a: &[Node],
        b: &[Node],
        fault: Fault,
    ) -> io::Result<Cut> {
        self.install(cluster, &[(a, b), (b, a)], fault)
    }

    fn install(
        &self,
        cluster: &EtcdCluster,
        directions: &[(&[Node], &[Node])],
        fault: Fault,
    ) -> io::Result<Cut> {
        let chain = format!("cut{}", self.next_cut.fetch_add(1, Ordering::Relaxed));
        let mut script = format!(
            "add chain ip {TABLE} {chain} {{ type filter hook input priority filter; policy accept; }}\n"
        );
        for (from, to) in directions {
            for &sender in *from {
                for &receiver in *to {
                    for rule in rules(cluster, sender, receiver)? {
                        let _ = writeln!(
                            script,
                            "add rule ip {TABLE} {chain} meta l4proto tcp {rule} {}",
                            fault.verdict()
                        );
                    }
                }
            }
        }
        netns::nft(&script)?;
        Ok(Cut {
            chain,
            healed: false,
        })
    }
}

/// The address member `i` listens and dials from.
fn member_address(i: usize) -> Ipv4Addr {
    let [a, b, c, d] = Ipv4Addr::LOCALHOST.octets();
    // i < MAX_MEMBERS: no overflow.
    Ipv4Addr::new(a, b, c, d + 1 + i as u8)
}

/// The user id member `i` runs as.
fn member_uid(i: usize) -> u32 {
    UID_BASE + i as u32
}

/// Member `i`'s address and client port, checked to be one [`NetFaults`] placed.
fn placed(cluster: &EtcdCluster, i: usize) -> io::Result<(Ipv4Addr, u16)> {
    if i >= cluster.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no member {i}: the cluster has {} member(s)", cluster.len()),
        ));
    }
    let address = cluster.member_address(i);
    if i >= MAX_MEMBERS || address != member_address(i) || cluster.member_uid(i).is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "member {i} listens on {address}: start the cluster from \
                 NetFaults::cluster_builder so that cuts can tell its packets apart"
            ),
        ));
    }
    Ok((address, cluster.client_port(i)))
}

/// The matches (without verdict) for every packet from `sender` to `receiver`, as seen on
/// the `input` hook. A connection's first direction ("original") carries its dialer's
/// address as source (after the NAT rule) and its listener's as destination; its answers
/// ("reply") carry the listener's as source and, already translated back, `127.0.0.1` as
/// destination, so the dialer is read from the connection's reply tuple instead.
fn rules(cluster: &EtcdCluster, sender: Node, receiver: Node) -> io::Result<Vec<String>> {
    Ok(match (sender, receiver) {
        (Node::Client, Node::Client) => Vec::new(),
        (Node::Member(i), Node::Member(j)) if i == j => Vec::new(),
        (Node::Client, Node::Member(j)) => {
            let (address, port) = placed(cluster, j)?;
            vec![format!(
                "ct direction original ip saddr {CLIENT_ADDR} ip daddr {address} tcp dport {port}"
            )]
        }
        (Node::Member(i), Node::Client) => {
            let (address, port) = placed(cluster, i)?;
            vec![format!(
                "ct direction reply ip saddr {address} tcp sport {port} ct reply ip daddr {CLIENT_ADDR}"
            )]
        }
        (Node::Member(i), Node::Member(j)) => {
            let (from, _) = placed(cluster, i)?;
            let (to, _) = placed(cluster, j)?;
            vec![
                format!("ct direction original ip saddr {from} ip daddr {to}"),
                format!("ct direction reply ip saddr {from} ct reply ip daddr {to}"),
            ]
        }
    })
}

/// Faults installed by [`NetFaults::cut`] or [`NetFaults::cut_both`]; healed by
/// [`heal`](Cut::heal), or when dropped (errors ignored then).
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::{Fault, Node};
/// # let net: etcd_sync::testing::NetFaults = unimplemented!();
/// let cluster = net.cluster_builder(3)?.start()?;
/// let cut = net.cut_both(&cluster, &[Node::Client], &[Node::Member(0)], Fault::BlackHole)?;
/// cut.heal()?; // packets flow again
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "a cut is healed when dropped"]
pub struct Cut {
    chain: String,
    healed: bool,
}

impl Cut {
    /// Deletes the rules: packets flow again (connections that gave up stay closed).
    ///
    /// # Errors
    ///
    /// `nft`'s error.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use etcd_sync::testing::{Fault, Node};
    /// # let net: etcd_sync::testing::NetFaults = unimplemented!();
    /// # let cluster = net.cluster_builder(3)?.start()?;
    /// let cut = net.cut(&cluster, &[Node::Client], &[Node::Member(2)], Fault::Reset)?;
    /// cut.heal()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn heal(mut self) -> io::Result<()> {
        self.delete()
    }

    fn delete(&mut self) -> io::Result<()> {
        if self.healed {
            return Ok(());
        }
        let chain = &self.chain;
        netns::nft(&format!(
            "flush chain ip {TABLE} {chain}\ndelete chain ip {TABLE} {chain}\n"
        ))?;
        self.healed = true;
        Ok(())
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        let _ = self.delete();
    }
}
