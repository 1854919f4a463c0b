//! Real network partitions (issue 47): packets dropped (black hole) or reset by nftables
//! rules between the test's clients and a member, one way or both, or between members, on
//! a 3-member cluster. Each test runs again inside a private network namespace it makes
//! itself (`NetFaults::enter`: root, `unshare`, `nft`; scripts/test installs nftables), so
//! the machine's firewall is never touched. Tests run one at a time, each bounded in time;
//! the figures they measure are printed (run with `--nocapture` to read them).

#![cfg(feature = "testing")]

mod common;

use std::sync::Mutex as StdMutex;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{eventually, keys, session};
use etcd_sync::crossbeam_channel::select;
use etcd_sync::testing::{EtcdCluster, Fault, NetFaults, Node};
use etcd_sync::{CancelToken, Client, WaitOptions};

static SERIAL: StdMutex<()> = StdMutex::new(());

/// Longest a test may run inside its namespace before it is killed.
const LIMIT: Duration = Duration::from_secs(150);

/// Inside the test's own network namespace, `Some`; outside, runs the test there (one test
/// at a time: each starts three etcd processes) and returns `None` once it passed.
fn enter(test: &str) -> Option<NetFaults> {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    match NetFaults::enter(test, LIMIT) {
        Ok(net) => net,
        Err(e) => panic!("{e}"),
    }
}

fn start_cluster(net: &NetFaults) -> EtcdCluster {
    common::trace_from_env();
    net.cluster_builder(3)
        .and_then(|builder| builder.start())
        .unwrap_or_else(|e| panic!("cannot start an etcd cluster for the test: {e}"))
}

fn client_for(endpoints: &[String]) -> Client {
    common::try_client_for(endpoints, Duration::from_secs(2)).expect("connect to the cluster")
}

/// The endpoints of every member but `member`.
fn others(all: &[String], member: usize) -> Vec<String> {
    (0..all.len())
        .filter(|i| *i != member)
        .map(|i| all[i].clone())
        .collect()
}

/// The members but `member`, as nodes.
fn other_members(member: usize) -> Vec<Node> {
    (0..3).filter(|i| *i != member).map(Node::Member).collect()
}

/// After the faults healed: nothing left under `prefix` (leases of lost sessions expire
/// on their own, within their TTL).
fn assert_nothing_left(all: &[String], prefix: &str) {
    let c = client_for(all);
    assert!(
        eventually(Duration::from_secs(15), || keys(&c, prefix).is_empty()),
        "keys left under {prefix}: {:?}",
        keys(&c, prefix)
    );
}

/// One trial of test 1 (and 3): a holder pinned to `member` (session TTL 2 s), a waiter on
/// the other members; the cut made by `cut`; returns how long before the waiter acquired
/// the holder's guard reported the loss. Checks, when the waiter acquires, that the
/// holder's guard says lost and that etcd's first key is the waiter's.
fn loss_trial(
    cl: &EtcdCluster,
    name: &str,
    member: usize,
    cut: impl FnOnce() -> etcd_sync::testing::Cut,
) -> Duration {
    let all = cl.endpoints();
    let pinned = client_for(&[all[member].clone()]);
    let s = session(&pinned, 2);
    let g = s.mutex(name).unwrap().lock().unwrap();
    let waiter_client = client_for(&others(&all, member));
    let ws = session(&waiter_client, 10);
    let wm = ws.mutex(name).unwrap();
    let waiter = thread::spawn(move || {
        wm.lock_timeout(Duration::from_secs(20))
            .map(|g| (Instant::now(), g))
    });
    let prefix = format!("{name}/");
    assert!(
        eventually(Duration::from_secs(5), || keys(&waiter_client, &prefix)
            .len()
            == 2),
        "{name}: the waiter did not join the line"
    );
    let cut = cut();
    let fired = g.lost().recv_timeout(Duration::from_secs(15));
    let lost_at = Instant::now();
    assert!(
        fired.is_err_and(|e| e.is_disconnected()),
        "{name}: no loss signal within 15 s"
    );
    let (acquired_at, next) = waiter
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("{name}: the waiter did not acquire: {e}"));
    assert!(!g.is_held(), "{name}: the holder still says held");
    // etcd's view, through a member the holder's cut does not touch.
    let line = waiter_client.get_prefix(&prefix).unwrap();
    let first = line.iter().min_by_key(|kv| kv.create_revision);
    assert_eq!(
        first.map(|kv| kv.key.clone()),
        Some(next.key().to_vec()),
        "{name}: the waiter acquired but is not first in etcd"
    );
    assert!(
        line.iter().all(|kv| kv.key != g.key()),
        "{name}: the holder's key is still in etcd"
    );
    let lead = acquired_at
        .checked_duration_since(lost_at)
        .unwrap_or_else(|| {
            panic!(
                "{name}: the waiter acquired {:?} before the holder's guard reported the loss",
                lost_at - acquired_at
            )
        });
    cut.heal().unwrap();
    drop(next);
    drop(g);
    lead
}

/// Item 1 of issue 47: a holder cut from its only member (both ways; black hole and reset) hears of
/// the loss before anyone else can acquire: 20 trials, the pinned member rotating over all three
/// (so it is sometimes the raft leader).
#[test]
fn a_holder_cut_from_its_member_learns_the_loss_before_anyone_acquires() {
    let Some(net) = enter("a_holder_cut_from_its_member_learns_the_loss_before_anyone_acquires")
    else {
        return;
    };
    let cl = start_cluster(&net);
    let mut report = Vec::new();
    for fault in [Fault::BlackHole, Fault::Reset] {
        let mut leads = Vec::new();
        for trial in 0..10 {
            let member = trial % 3;
            let name = format!("p-holder-{fault:?}-{trial}");
            let lead = loss_trial(&cl, &name, member, || {
                net.cut_both(&cl, &[Node::Client], &[Node::Member(member)], fault)
                    .unwrap()
            });
            leads.push(lead.as_millis());
        }
        report.push(format!("{fault:?}: {leads:?}"));
    }
    eprintln!(
        "etcd {}: leads (holder's loss reported -> other acquired), ms: {}",
        cl.version(),
        report.join("; ")
    );
    assert_nothing_left(&cl.endpoints(), "p-holder-");
}

/// Item 3 of issue 47: one-way partitions between a holder's client and its member: the client
/// cannot send (its member hears nothing), or it sends and hears nothing back. Either way, when
/// another acquires, the holder's guard has said lost and etcd no longer has its key.
#[test]
fn a_one_way_partition_never_leaves_a_guard_held_while_another_holds() {
    let Some(net) = enter("a_one_way_partition_never_leaves_a_guard_held_while_another_holds")
    else {
        return;
    };
    let cl = start_cluster(&net);
    let mut report = Vec::new();
    for fault in [Fault::BlackHole, Fault::Reset] {
        for (direction, member) in [("client->member", 0), ("member->client", 1)] {
            let name = format!("p-oneway-{fault:?}-{}", &direction[..6]);
            let lead = loss_trial(&cl, &name, member, || {
                let (from, to) = if direction == "client->member" {
                    (Node::Client, Node::Member(member))
                } else {
                    (Node::Member(member), Node::Client)
                };
                net.cut(&cl, &[from], &[to], fault).unwrap()
            });
            report.push(format!(
                "{fault:?} {direction} cut: {} ms",
                lead.as_millis()
            ));
        }
    }
    eprintln!(
        "etcd {}: one-way leads (loss reported -> other acquired): {}",
        cl.version(),
        report.join("; ")
    );
    assert_nothing_left(&cl.endpoints(), "p-oneway-");
}

/// Item 2 of issue 47: a waiter whose member is cut off (black hole, then reset) goes on waiting on
/// another endpoint and takes the lock when it is released; its session survives.
#[test]
fn a_waiter_whose_member_is_cut_off_fails_over_and_acquires() {
    let Some(net) = enter("a_waiter_whose_member_is_cut_off_fails_over_and_acquires") else {
        return;
    };
    let cl = start_cluster(&net);
    let all = cl.endpoints();
    let mut report = Vec::new();
    for fault in [Fault::BlackHole, Fault::Reset] {
        let name = format!("p-failover-{fault:?}");
        let holder_client = client_for(&[all[1].clone()]);
        let hs = session(&holder_client, 10);
        let g = hs.mutex(&name).unwrap().lock().unwrap();
        let waiter_client = client_for(&all); // talks to member 0 first
        let ws = session(&waiter_client, 10);
        let wm = ws.mutex(&name).unwrap();
        let waiter = thread::spawn(move || {
            wm.lock_timeout(Duration::from_secs(40))
                .map(|g| (Instant::now(), g.fencing_token()))
        });
        let prefix = format!("{name}/");
        assert!(eventually(Duration::from_secs(5), || keys(
            &holder_client,
            &prefix
        )
        .len()
            == 2));
        let cut = net
            .cut_both(&cl, &[Node::Client], &[Node::Member(0)], fault)
            .unwrap();
        let cut_at = Instant::now();
        thread::sleep(Duration::from_secs(3));
        assert!(
            !waiter.is_finished(),
            "{name}: the waiter's wait ended while the holder held: {:?}",
            waiter.join().unwrap().map(|(_, token)| token)
        );
        let token = g.fencing_token();
        let released_at = Instant::now();
        drop(g);
        let (acquired_at, next) = waiter
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("{name}: the waiter did not acquire: {e}"));
        assert!(next > token);
        assert!(acquired_at >= released_at);
        assert!(ws.is_alive(), "{name}: {:?}", ws.loss_reason());
        report.push(format!(
            "{fault:?}: acquired {} ms after the release ({} ms after the cut)",
            (acquired_at - released_at).as_millis(),
            (acquired_at - cut_at).as_millis()
        ));
        cut.heal().unwrap();
    }
    eprintln!(
        "etcd {}: waiter failover: {}",
        cl.version(),
        report.join("; ")
    );
    assert_nothing_left(&all, "p-failover-");
}

/// Item 5 of issue 47: waits that time out or are cancelled while their member is cut off leave
/// nothing behind once the partition heals, while their session lives on.
#[test]
fn waits_ended_during_a_partition_leave_no_key_after_it_heals() {
    let Some(net) = enter("waits_ended_during_a_partition_leave_no_key_after_it_heals") else {
        return;
    };
    let cl = start_cluster(&net);
    let all = cl.endpoints();
    let mut report = Vec::new();
    for fault in [Fault::BlackHole, Fault::Reset] {
        let name = format!("p-ended-{fault:?}");
        let prefix = format!("{name}/");
        let holder_client = client_for(&[all[1].clone()]);
        let hs = session(&holder_client, 30);
        let g = hs.mutex(&name).unwrap().lock().unwrap();
        let waiter_client = client_for(&[all[0].clone()]); // member 0 only
        // One session each: a session has one key per name.
        let (ws, ws2) = (session(&waiter_client, 30), session(&waiter_client, 30));
        let (timed, cancelled) = (ws.mutex(&name).unwrap(), ws2.mutex(&name).unwrap());
        let timing_out = thread::spawn(move || timed.lock_timeout(Duration::from_secs(4)).err());
        let token = CancelToken::new();
        let options = WaitOptions::new().cancel_token(&token);
        let cancelling = thread::spawn(move || cancelled.lock_with(options).err());
        assert!(eventually(Duration::from_secs(5), || keys(
            &holder_client,
            &prefix
        )
        .len()
            == 3));
        let cut = net
            .cut_both(&cl, &[Node::Client], &[Node::Member(0)], fault)
            .unwrap();
        thread::sleep(Duration::from_secs(1));
        token.cancel();
        let timed_out = timing_out.join().unwrap();
        let was_cancelled = cancelling.join().unwrap();
        assert!(
            timed_out.is_some() && was_cancelled.is_some(),
            "{name}: a wait acquired while the holder held"
        );
        report.push(format!(
            "{fault:?}: timed out with {:?}, cancelled with {:?}",
            timed_out.map(|e| e.to_string()),
            was_cancelled.map(|e| e.to_string())
        ));
        cut.heal().unwrap();
        let healed_at = Instant::now();
        // The waiters' keys go while their session (TTL 30 s) still lives.
        let gone = eventually(Duration::from_secs(15), || {
            keys(&holder_client, &prefix).len() == 1
        });
        assert!(
            gone,
            "{name}: keys of ended waits left 15 s after healing: {:?}",
            keys(&holder_client, &prefix)
        );
        assert!(
            ws.is_alive() && ws2.is_alive(),
            "{name}: a waiter's session was lost"
        );
        report.push(format!(
            "{fault:?}: their keys gone {} ms after healing",
            healed_at.elapsed().as_millis()
        ));
        drop(g);
    }
    eprintln!("etcd {}: {}", cl.version(), report.join("; "));
    assert_nothing_left(&all, "p-ended-");
}

/// What a leader loop's work closure reports: elected (with its token) or stepped down.
#[derive(Debug)]
enum Term {
    Elected(i64),
    SteppedDown,
}

/// A leader loop on `endpoints` (session TTL 3 s) sending its terms to `tx` until `cancel`.
fn spawn_loop(
    endpoints: Vec<String>,
    tag: &'static str,
    tx: mpsc::Sender<(&'static str, Term, Instant)>,
    cancel: CancelToken,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let c = client_for(&endpoints);
        let s = c
            .session_builder()
            .ttl(Duration::from_secs(3))
            .start()
            .unwrap();
        let e = s.election("p-elect").unwrap();
        let result = e.leader_loop(tag).run(&cancel, |leadership, cancel| {
            let _ = tx.send((
                tag,
                Term::Elected(leadership.fencing_token()),
                Instant::now(),
            ));
            select! {
                recv(leadership.lost()) -> _ => {
                    let _ = tx.send((tag, Term::SteppedDown, Instant::now()));
                }
                recv(cancel.cancelled()) -> _ => {}
            }
        });
        assert!(result.is_ok(), "{tag}: the loop ended with {result:?}");
    })
}

type Events = mpsc::Receiver<(&'static str, Term, Instant)>;

/// The first term event of `tag` not taken yet, from `seen` or else within `limit`; events
/// of the other loop are kept in `seen` for later.
fn next_of(
    rx: &Events,
    seen: &mut Vec<(&'static str, Term, Instant)>,
    tag: &str,
    limit: Duration,
) -> Option<(Term, Instant)> {
    if let Some(i) = seen.iter().position(|(who, ..)| *who == tag) {
        let (_, term, at) = seen.remove(i);
        return Some((term, at));
    }
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (who, term, at) = rx.recv_timeout(left).ok()?;
        if who == tag {
            return Some((term, at));
        }
        seen.push((who, term, at));
    }
}

/// Item 4 of issue 47: a leader loop whose member ends up in the minority (isolated from both
/// others: as raft leader, and as follower; black hole and reset) steps down; a loop on the
/// majority side is elected within the session TTL (3 s) plus a bound, and not before the minority
/// leader stepped down.
#[test]
fn a_leader_loop_on_the_minority_side_steps_down_and_the_majority_elects() {
    let Some(net) = enter("a_leader_loop_on_the_minority_side_steps_down_and_the_majority_elects")
    else {
        return;
    };
    let cl = start_cluster(&net);
    let all = cl.endpoints();
    let mut report = Vec::new();
    let rounds = [
        ("leader", Fault::BlackHole),
        ("follower", Fault::Reset),
        ("leader", Fault::Reset),
        ("follower", Fault::BlackHole),
    ];
    for (role, fault) in rounds {
        let raft_leader = cl.leader().unwrap();
        let minority = if role == "leader" {
            raft_leader
        } else {
            (raft_leader + 1) % 3
        };
        let (tx, rx) = mpsc::channel();
        let mut seen = Vec::new();
        let cancel = CancelToken::new();
        let a = spawn_loop(
            vec![all[minority].clone()],
            "minority",
            tx.clone(),
            cancel.clone(),
        );
        let elected = next_of(&rx, &mut seen, "minority", Duration::from_secs(10));
        let Some((Term::Elected(first_token), _)) = elected else {
            panic!("the minority-side loop was not elected first: {elected:?}");
        };
        let b = spawn_loop(others(&all, minority), "majority", tx, cancel.clone());
        thread::sleep(Duration::from_millis(500));
        let cut = net
            .cut_both(
                &cl,
                &[Node::Member(minority)],
                &other_members(minority),
                fault,
            )
            .unwrap();
        let cut_at = Instant::now();
        let down = next_of(&rx, &mut seen, "minority", Duration::from_secs(15));
        let Some((Term::SteppedDown, down_at)) = down else {
            panic!("{role} {fault:?}: the minority-side leader did not step down: {down:?}");
        };
        let up = next_of(&rx, &mut seen, "majority", Duration::from_secs(20));
        let Some((Term::Elected(next_token), up_at)) = up else {
            panic!("{role} {fault:?}: the majority side elected no leader: {up:?}");
        };
        assert!(
            up_at >= down_at,
            "{role} {fault:?}: the majority's leader started {:?} before the minority's \
             stepped down",
            down_at - up_at
        );
        assert!(next_token > first_token);
        let took = up_at - cut_at;
        assert!(
            took <= Duration::from_secs(3 + 10),
            "{role} {fault:?}: the majority elected after {took:?} (TTL 3 s + 10 s)"
        );
        report.push(format!(
            "{role} isolated, {fault:?}: stepped down after {} ms, majority elected after {} ms",
            (down_at - cut_at).as_millis(),
            took.as_millis()
        ));
        cut.heal().unwrap();
        cancel.cancel();
        a.join().unwrap();
        b.join().unwrap();
        cl.wait_healthy(Duration::from_secs(20)).unwrap();
    }
    eprintln!("etcd {}: leader loops: {}", cl.version(), report.join("; "));
    assert_nothing_left(&all, "p-elect");
}
