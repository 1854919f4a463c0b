//! Compaction followed by a broken watch stream (issue 25, defect 1), on real etcd.
//!
//! A watcher on a quiet name remembers the revision after its last event. When history up
//! to a later revision is compacted and the stream then breaks (the member restarts, or the
//! client fails over), that revision can no longer be watched from: etcd accepts the create
//! and cancels the watcher right after with `compact_revision`. The client must then start
//! the watcher again from now and have its subscribers read once, not try the same revision
//! again forever (a waiter that never wakes, a guard that never learns its key is gone, ten
//! streams a second). Scenarios run one at a time: each starts its own etcd.

#![cfg(feature = "testing")]

mod common;

use std::sync::Mutex as StdMutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{eventually, session, streams_started};
use etcd_sync::testing::{EtcdCluster, EtcdServer};
use etcd_sync::{Client, Mutex, Result};

static SERIAL: StdMutex<()> = StdMutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a released lock may take to reach its parked waiter here: generous (the
/// machine is loaded); the defect made it never (the wait timed out at 25 s).
const HANDOFF_BOUND: Duration = Duration::from_secs(3);

fn client_for(endpoints: &[String]) -> Client {
    common::try_client_for(endpoints, Duration::from_secs(2)).expect("connect to etcd")
}

/// Parks a waiter on `mutex` (behind a holder) on a thread: it answers with the instant it
/// acquired, or its error.
fn park(mutex: Mutex) -> JoinHandle<Result<Instant>> {
    let waiter = std::thread::spawn(move || {
        let guard = mutex.lock_timeout(Duration::from_secs(25))?;
        let at = Instant::now();
        drop(guard);
        Ok(at)
    });
    std::thread::sleep(Duration::from_millis(500)); // parked: its watcher runs
    waiter
}

/// Writes 20 times to a key nobody watches and compacts at the last revision: the quiet
/// watchers' resume revisions are compacted now.
fn noise_and_compact(c: &Client, key: &str) {
    let mut rev = 0;
    for i in 0..20 {
        rev = c.put(key, i.to_string()).expect("put noise");
    }
    c.compact(rev).expect("compact");
}

/// Watch streams etcd started over `window` (metrics of one member): a client whose
/// watchers run opens none.
fn watch_streams_opened(metrics: impl Fn() -> String, window: Duration) -> u64 {
    let before = streams_started(&metrics(), "Watch");
    std::thread::sleep(window);
    streams_started(&metrics(), "Watch").saturating_sub(before)
}

/// Releases `guard` and checks that the parked `waiter` acquired promptly.
fn release_and_check(guard: etcd_sync::MutexGuard, waiter: JoinHandle<Result<Instant>>) {
    // From the release request: the waiter can get the lock before `release` returns.
    let released = Instant::now();
    guard.release().expect("release");
    let acquired = match waiter.join() {
        Ok(Ok(at)) => at,
        Ok(Err(e)) => panic!(
            "the waiter did not get the free lock: {e} ({:?} after the release)",
            released.elapsed()
        ),
        Err(_) => panic!("the waiter panicked"),
    };
    let took = acquired.saturating_duration_since(released);
    eprintln!("handoff after compaction and a stream break: {took:?}");
    assert!(
        took <= HANDOFF_BOUND,
        "the waiter acquired {took:?} after the release"
    );
}

#[test]
fn a_waiter_wakes_after_compaction_and_a_member_restart() {
    let _serial = serial();
    let server = EtcdServer::start().expect("start etcd");
    let c = client_for(&server.endpoints());
    let s1 = session(&c, 20);
    let s2 = session(&c, 20);
    let guard = s1.mutex("c-restart").unwrap().lock().unwrap();
    let waiter = park(s2.mutex("c-restart").unwrap());
    noise_and_compact(&c, "c-restart-noise");
    server.kill().expect("kill etcd");
    server.restart().expect("restart etcd");
    // The client finds the member again (keep-alives, its watch stream).
    assert!(eventually(Duration::from_secs(5), || c.get("x").is_ok()));
    std::thread::sleep(Duration::from_secs(1));
    release_and_check(guard, waiter);
    // (d) The watch stream settled (the mutex keeps its name's watcher): not one stream
    // after another.
    let opened = watch_streams_opened(
        || server.metrics().expect("metrics"),
        Duration::from_secs(2),
    );
    assert!(
        opened <= 1,
        "the client opened {opened} watch streams in 2 s after the restart"
    );
}

/// Endpoints of `cluster`, member `first` first (the client talks to the first that answers).
fn starting_at(cluster: &EtcdCluster, first: usize) -> Vec<String> {
    let all = cluster.endpoints();
    (0..all.len())
        .map(|i| all[(first + i) % all.len()].clone())
        .collect()
}

/// The member a waiter's client talks to first (it will stall), and one to write through:
/// neither is the leader, so a pause of the first leaves the cluster writable at once.
fn stalled_and_other(cluster: &EtcdCluster) -> (usize, usize) {
    let leader = cluster.leader().expect("a leader");
    ((leader + 1) % 3, (leader + 2) % 3)
}

/// Deletes `keys` through `c` while member `stalled` is paused, compacts past the deletes,
/// and kills the member: its clients resume their watchers elsewhere with the deletes in a
/// compacted gap. Returns when the member was killed.
fn delete_in_a_watch_gap(
    cluster: &EtcdCluster,
    stalled: usize,
    c: &Client,
    keys: &[&str],
) -> Instant {
    cluster.pause(stalled).expect("pause the waiter's member");
    for key in keys {
        c.delete(key).expect("delete the key");
    }
    noise_and_compact(c, "watch-gap-noise");
    cluster.kill(stalled).expect("kill the waiter's member");
    Instant::now()
}

/// Kills member 0 (SIGKILL) and waits until the client answers through another one.
fn fail_over(cluster: &EtcdCluster, c: &Client) {
    cluster.kill(0).expect("kill member 0");
    assert!(eventually(Duration::from_secs(10), || c.get("x").is_ok()));
    std::thread::sleep(Duration::from_secs(1));
}

#[test]
fn a_waiter_wakes_after_compaction_and_a_failover() {
    let _serial = serial();
    let cl = common::cluster();
    let c = client_for(&starting_at(&cl, 0));
    let s1 = session(&c, 20);
    let s2 = session(&c, 20);
    let guard = s1.mutex("c-failover").unwrap().lock().unwrap();
    let waiter = park(s2.mutex("c-failover").unwrap());
    noise_and_compact(&c, "c-failover-noise");
    fail_over(&cl, &c);
    release_and_check(guard, waiter);
    // (d) The client's stream is on member 1 or 2 now; together they see every stream it
    // opens.
    let metrics = || {
        let one = cl.metrics(1).expect("metrics of member 1");
        let two = cl.metrics(2).expect("metrics of member 2");
        format!("{one}\n{two}")
    };
    let opened = watch_streams_opened(metrics, Duration::from_secs(2));
    assert!(
        opened <= 1,
        "the client opened {opened} watch streams in 2 s after the failover"
    );
}

#[test]
fn a_guard_learns_its_key_was_deleted_after_compaction_and_a_failover() {
    let _serial = serial();
    let cl = common::cluster();
    let c = client_for(&starting_at(&cl, 0));
    let s = session(&c, 20);
    let guard = s.mutex("c-guard").unwrap().lock().unwrap();
    std::thread::sleep(Duration::from_millis(700)); // the guard follows its key now
    noise_and_compact(&c, "c-guard-noise");
    fail_over(&cl, &c);
    assert!(guard.is_held());
    let lost = guard.lost();
    let other = client_for(&starting_at(&cl, 1));
    let deleted = Instant::now();
    other.delete(guard.key()).expect("delete the guard's key");
    let noticed = lost
        .recv_timeout(Duration::from_secs(2))
        .is_err_and(|e| e.is_disconnected());
    let took = deleted.elapsed();
    assert!(
        noticed && !guard.is_held(),
        "the guard still says it holds {took:?} after its key was deleted"
    );
    eprintln!("guard loss noticed after compaction and a failover: {took:?}");
}

/// With progress notifications, a quiet watcher's resume revision keeps up with the store:
/// after compaction and a restart it resumes where it was, and the waiter needs no read.
#[test]
fn progress_notifications_keep_a_quiet_watcher_resumable() {
    let _serial = serial();
    let server = EtcdServer::builder()
        .watch_progress_notify_interval(Duration::from_millis(200))
        .start()
        .expect("start etcd");
    let c = client_for(&server.endpoints());
    let s1 = session(&c, 20);
    let s2 = session(&c, 20);
    let guard = s1.mutex("c-progress").unwrap().lock().unwrap();
    let waiter = park(s2.mutex("c-progress").unwrap());
    noise_and_compact(&c, "c-progress-noise");
    std::thread::sleep(Duration::from_secs(1)); // a few progress notifications
    server.kill().expect("kill etcd");
    server.restart().expect("restart etcd");
    // etcd's counters start again at 0: wait until the client's watch stream is back.
    let metrics = || server.metrics().expect("metrics");
    assert!(eventually(Duration::from_secs(5), || {
        streams_started(&metrics(), "Watch") >= 1
    }));
    std::thread::sleep(Duration::from_secs(1));
    release_and_check(guard, waiter);
    // The watcher resumed where it was and the waiter owned by the release's delete event:
    // no read since the restart (the release itself is a transaction, not a range).
    let ranges = common::handled(&metrics(), "Range");
    assert_eq!(ranges, 0, "{ranges} reads since the restart");
}

/// etcd before 3.4.34 and 3.5.15 (Debian's 3.4.23, PyPI's 3.5.1) loses the deletes at
/// exactly its compact revision from a watcher that starts there (etcd #18089). A waiter's
/// watcher resumed right after the last revision it saw: when the key ahead was deleted at
/// that very revision and history was compacted there while the stream was down, the
/// delete never came, and a waiter whose key was deleted with it could even take a later
/// delete of a re-created key for its turn (found by the simulation, issue 29). The
/// watcher now resumes one revision early, so that compaction is refused as compacted and
/// the waiter reads. Fails before the fix on the old servers (the waiter times out).
#[test]
fn a_delete_at_exactly_the_compact_revision_reaches_a_resumed_waiter() {
    let _serial = serial();
    let cl = common::cluster();
    let (stalled, other) = stalled_and_other(&cl);
    let cw = client_for(&starting_at(&cl, stalled));
    let ch = client_for(&starting_at(&cl, other));
    let holder = session(&ch, 30);
    let guard = holder.mutex("c-exact").unwrap().lock().unwrap();
    let waiter = park(session(&cw, 30).mutex("c-exact").unwrap());
    // The waiter's stream stalls; nothing is written meanwhile but the delete, so the
    // delete is the revision right after the last one the waiter's watcher saw.
    cl.pause(stalled).expect("pause the waiter's member");
    let key = guard.key().to_vec();
    let deleted = ch
        .txn(etcd_sync::Txn::new().and_then([etcd_sync::TxnOp::delete(key)]))
        .expect("delete the holder's key");
    ch.compact(deleted.revision).expect("compact at the delete");
    // The member dies: the waiter's client resumes its watcher on another one.
    cl.kill(stalled).expect("kill the waiter's member");
    let released = Instant::now();
    let acquired = waiter.join().expect("the waiter thread");
    let at = acquired.unwrap_or_else(|e| {
        panic!(
            "the waiter never got the lock whose key went at the compact revision: {e} \
             ({:?} after the delete)",
            released.elapsed()
        )
    });
    let took = at.saturating_duration_since(released);
    eprintln!("waiter acquired {took:?} after a delete at the compact revision");
    assert!(
        took <= Duration::from_secs(10),
        "the waiter acquired {took:?} after"
    );
    drop(guard);
}

/// A waiter at the back of the line (it watches the key ahead and its own key, each
/// alone) whose own key was deleted while its stream was down, with history compacted
/// past the delete: its own key's watcher resumes late and the delete is never delivered.
/// The waiter used to ignore that gap and wait on for the key ahead to go; when that key
/// stays (a long hold, or the leader's key a hand-over made its own: the randomized
/// checker found a successor's `campaign` that never returned through etcd's gRPC proxy),
/// it waited without a key for as long. It now reads its own key after such a gap and
/// ends with `LockLost`. Fails before the fix (the wait runs to its 25 s limit).
#[test]
fn a_waiter_at_the_back_learns_its_key_went_in_a_watch_gap() {
    let _serial = serial();
    let cl = common::cluster();
    let back = Back::park(&cl, "c-own-gap", None);
    let own = format!("c-own-gap/{:x}", back.session.lease_id());
    let killed = delete_in_a_watch_gap(&cl, back.stalled, &back.other, &[&own]);
    let (result, _) = back.waiter.join().expect("the waiter thread");
    let took = killed.elapsed();
    eprintln!("the waiter ended {took:?} after the failover: {result:?}");
    assert!(
        matches!(result, Err(etcd_sync::Error::LockLost)),
        "the waiter whose key went ended with {result:?} after {took:?}"
    );
    assert!(
        took <= Duration::from_secs(10),
        "the waiter ended {took:?} after"
    );
    assert!(back.guard.is_held());
}

/// The same gap for the key ahead: a waiter at the back whose lookout (here the holder's
/// key) was deleted while its stream was down, with history compacted past the delete,
/// reads the lookout once its watcher resumes and takes its turn. Without that read it
/// waits for a delete that was never delivered (to its 25 s limit): kills the mutants of
/// `line/behind/` that drop or misroute the lookout's gap read
/// (docs/design/mutation-score.md).
#[test]
fn a_waiter_at_the_back_takes_its_turn_when_the_key_ahead_went_in_a_watch_gap() {
    let _serial = serial();
    let cl = common::cluster();
    // The lookout counts as far (no polling while its watcher may sync): its start gap is
    // read once, late.
    let back = Back::park(&cl, "c-ahead-gap", Some(0));
    let ahead = back.guard.key_str().into_owned();
    let killed = delete_in_a_watch_gap(&cl, back.stalled, &back.other, &[&ahead]);
    let (result, _) = back.waiter.join().expect("the waiter thread");
    let took = killed.elapsed();
    eprintln!("the waiter ended {took:?} after the failover: {result:?}");
    assert!(
        result.is_ok(),
        "the waiter whose lookout went ended with {result:?} after {took:?}"
    );
    assert!(
        took <= Duration::from_secs(10),
        "the waiter took its turn {took:?} after"
    );
    assert!(!back.guard.is_held(), "the holder's key is gone");
}

/// The same gap for a permit at the back, whose lookout is every permit ahead (two, of a
/// semaphore of two): both deleted while the waiter's stream was down, history compacted
/// past the deletes. The waiter reads its lookouts in one Txn once their watchers resume
/// and takes its turn. Kills `all_there` answering "all there" without the read, or when
/// none is (mutants of `line/behind/`, docs/design/mutation-score.md).
#[test]
fn a_permit_at_the_back_takes_its_turn_when_a_permit_ahead_went_in_a_watch_gap() {
    let _serial = serial();
    let cl = common::cluster();
    let (stalled, other) = stalled_and_other(&cl);
    let cw = common::client_without_front(&starting_at(&cl, stalled), None);
    let ch = client_for(&starting_at(&cl, other));
    let holders = [session(&ch, 30), session(&ch, 30)];
    let permits: Vec<_> = holders
        .iter()
        .map(|s| s.semaphore("c-permit-gap", 2).unwrap().acquire().unwrap())
        .collect();
    let ws = session(&cw, 30);
    let sem = ws.semaphore("c-permit-gap", 2).unwrap();
    let waiter = std::thread::spawn(move || {
        sem.acquire_timeout(Duration::from_secs(25))
            .map(|p| p.is_held())
    });
    assert!(eventually(Duration::from_secs(5), || common::keys(
        &ch,
        "c-permit-gap/"
    )
    .len()
        == 3));
    std::thread::sleep(Duration::from_millis(500)); // parked: its watchers run
    let gone: Vec<String> = permits.iter().map(|p| p.key_str().into_owned()).collect();
    let killed = delete_in_a_watch_gap(&cl, stalled, &ch, &[&gone[0], &gone[1]]);
    let result = waiter.join().expect("the waiter thread");
    let took = killed.elapsed();
    eprintln!("the permit's waiter ended {took:?} after the failover: {result:?}");
    assert!(
        matches!(result, Ok(true)),
        "the permit whose lookout went ended with {result:?} after {took:?}"
    );
    assert!(
        took <= Duration::from_secs(10),
        "the permit was taken {took:?} after"
    );
    assert!(!permits[1].is_held(), "its key is gone");
}

/// A waiter parked at the back of a line (no front of waiters at all) with one key ahead,
/// a holder's; the waiter's client talks to `stalled` first, the holder's to `other`.
/// `poll_near`: the line's `POLL_NEAR` (`None`: the default).
struct Back {
    stalled: usize,
    other: Client,
    guard: etcd_sync::MutexGuard,
    _holder: etcd_sync::Session,
    session: etcd_sync::Session,
    waiter: JoinHandle<(Result<()>, Duration)>,
}

impl Back {
    fn park(cl: &EtcdCluster, name: &str, poll_near: Option<usize>) -> Back {
        let (stalled, other) = stalled_and_other(cl);
        let cw = common::client_without_front(&starting_at(cl, stalled), poll_near);
        let ch = client_for(&starting_at(cl, other));
        let holder = session(&ch, 30);
        let guard = holder.mutex(name).unwrap().lock().unwrap();
        let ws = session(&cw, 30);
        let mutex = ws.mutex(name).unwrap();
        let waiter = std::thread::spawn(move || {
            let started = Instant::now();
            (
                mutex.lock_timeout(Duration::from_secs(25)).map(drop),
                started.elapsed(),
            )
        });
        let prefix = format!("{name}/");
        assert!(eventually(Duration::from_secs(5), || common::keys(
            &ch, &prefix
        )
        .len()
            == 2));
        std::thread::sleep(Duration::from_millis(500)); // parked: its watchers run
        Back {
            stalled,
            other: ch,
            guard,
            _holder: holder,
            session: ws,
            waiter,
        }
    }
}

/// A waiter's key deleted during its lock-delay while its stream is down, with history
/// compacted past the delete: the name's watcher resumes with a gap, and the proof that
/// the key is still ours must be read again there (`ownership/proof.rs`), or the wait
/// returns a guard over a key that is gone (rule 4). Kills `still_ours` answering "ours"
/// without a read, which the simulation's sweeps did not (docs/design/mutation-score.md).
#[test]
fn a_key_deleted_in_a_watch_gap_during_the_lock_delay_ends_the_wait() {
    let _serial = serial();
    let cl = common::cluster();
    let (stalled, other) = stalled_and_other(&cl);
    let cw = client_for(&starting_at(&cl, stalled));
    let ch = client_for(&starting_at(&cl, other));
    let holder = session(&ch, 2);
    let held = holder.mutex("c-delay").unwrap().lock().unwrap();
    let holder_key = held.key_str().into_owned();
    let ws = session(&cw, 30);
    let own = format!("c-delay/{:x}", ws.lease_id());
    let mutex = ws
        .mutex("c-delay")
        .unwrap()
        .lock_delay(Duration::from_secs(8))
        .unwrap();
    let waiter = std::thread::spawn(move || mutex.lock_timeout(Duration::from_secs(40)).map(drop));
    assert!(eventually(Duration::from_secs(5), || common::keys(
        &ch, "c-delay/"
    )
    .len()
        == 2));
    // The holder's keep-alive stops: etcd expires its lease, and the waiter's turn comes
    // with its lock-delay to wait.
    holder.orphan();
    std::mem::forget(held);
    assert!(eventually(Duration::from_secs(10), || !common::keys(
        &ch, "c-delay/"
    )
    .contains(&holder_key)));
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        !waiter.is_finished(),
        "the waiter did not wait out its lock-delay"
    );
    let killed = delete_in_a_watch_gap(&cl, stalled, &ch, &[&own]);
    let result = waiter.join().expect("the waiter thread");
    let took = killed.elapsed();
    eprintln!("the delayed wait ended {took:?} after the failover: {result:?}");
    assert!(
        matches!(&result, Err(e) if e.is_lost()),
        "the delayed wait whose key went in a watch gap returned {result:?} after {took:?}"
    );
    assert!(
        took < Duration::from_secs(6),
        "it ended {took:?} after the failover"
    );
    assert!(common::keys(&ch, "c-delay/").is_empty());
}
