//! Regression tests for the ownership core (#10): each reproduces a way to get two holders
//! or two leaders, a guard that says "held" over a key it no longer has, or a release that
//! blocks too long, against real etcd. Each failed on the code before the core.

#![cfg(feature = "testing")]

mod common;

use std::time::{Duration, Instant};

use common::{client, cluster, etcd, eventually, keys, session};
use etcd_sync::{Client, Error, LossReason, TryLockError};

/// Item 1: a timed-out campaign's cleanup used to be lease-scoped and ran on in the
/// background, deleting the key of the next campaign on the same session.
#[test]
fn a_timed_out_campaign_never_deletes_the_next_campaigns_key() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (a, b, cs) = (session(&c, 10), session(&c, 10), session(&c, 10));
    let mut leader_a = a.election("e1").unwrap().campaign("a").unwrap();
    let eb = b.election("e1").unwrap();
    assert!(matches!(
        eb.campaign_timeout("b", Duration::from_millis(300)),
        Err(Error::Timeout { .. })
    ));
    leader_a.resign().unwrap();
    let leader_b = eb.campaign("b").unwrap();
    // Longer than the old background cleanup (~600 ms).
    std::thread::sleep(Duration::from_millis(1500));
    assert!(leader_b.is_leader());
    assert_eq!(
        keys(&c, "e1/"),
        vec![leader_b.key_str().into_owned()],
        "B's key must survive the earlier timeout's cleanup"
    );
    assert!(
        matches!(
            cs.election("e1")
                .unwrap()
                .campaign_timeout("c", Duration::from_millis(800)),
            Err(Error::Timeout { .. })
        ),
        "C must not lead while B does"
    );
    assert_eq!(c.leader("e1").unwrap().unwrap().value, b"b");
}

/// Item 2: after an ambiguous enqueue (etcd frozen), the lease-scoped cleanup used to
/// delete the key of the next `lock()` on the same session and name.
#[test]
fn an_ambiguous_enqueue_never_deletes_the_next_holders_key() {
    let server = etcd();
    let c = common::client_with_timeout(&server.endpoints(), Duration::from_millis(500));
    let s = session(&c, 10);
    let m = s.mutex("m2").unwrap();
    server.pause().unwrap();
    // A blocking wait rides out the frozen etcd until its limit (issue 48): the enqueue
    // times out (ambiguous), is tried again, and the limit ends the wait.
    let frozen = m.lock_timeout(Duration::from_millis(1200));
    assert!(
        matches!(
            frozen,
            Err(Error::Timeout { .. } | Error::Unavailable { .. })
        ),
        "{frozen:?}"
    );
    std::thread::sleep(Duration::from_millis(300));
    server.resume().unwrap();
    let g = m.lock().expect("lock after etcd resumed");
    // Longer than every later look of the ambiguous cleanup (1 s, then 3 s).
    std::thread::sleep(Duration::from_millis(4500));
    assert!(g.is_held());
    let kv = c.get(g.key()).unwrap().expect("our key must still exist");
    assert_eq!(kv.create_revision, g.fencing_token());
    let other = session(&c, 10);
    assert!(
        matches!(
            other
                .mutex("m2")
                .unwrap()
                .lock_timeout(Duration::from_millis(800)),
            Err(Error::Timeout { .. })
        ),
        "another session acquired while we hold"
    );
    g.put("m2-data", "mine").expect("guarded write while held");
}

/// Item 3: a re-campaign used to return a second guard over the same key; dropping the
/// first resigned (deleted the shared key) while the second still said "leader".
#[test]
fn a_recampaign_supersedes_the_old_guard_instead_of_aliasing_it() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let e = s.election("e3").unwrap();
    let mut l = e.campaign("v1").unwrap();
    let first_lost = l.lost();
    let token = l.fencing_token();
    l = e.campaign("v2").unwrap(); // drops the first guard: must not resign
    assert!(
        matches!(
            first_lost.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        ),
        "the superseded guard reports it"
    );
    assert!(l.is_leader());
    assert_eq!(l.fencing_token(), token, "same key, same place");
    let leader = c.leader("e3").unwrap().expect("a leader");
    assert_eq!(leader.value, b"v2");
    assert_eq!(leader.create_revision, token);
    let other = session(&c, 10);
    assert!(matches!(
        other
            .election("e3")
            .unwrap()
            .campaign_timeout("x", Duration::from_millis(800)),
        Err(Error::Timeout { .. })
    ));
    // The superseded guard is inert; the live one still writes and resigns.
    l.put("e3-data", "leader").unwrap();
    drop(l);
    assert!(eventually(Duration::from_secs(2), || keys(&c, "e3/").is_empty()));
}

/// A superseded guard held in a variable (not dropped) answers false and cannot write.
#[test]
fn a_superseded_guard_is_inert() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let e = s.election("e3b").unwrap();
    let mut old = e.campaign("v1").unwrap();
    let new = e.campaign("v2").unwrap();
    assert!(!old.is_leader());
    assert!(matches!(old.proclaim("v3"), Err(Error::NotLeader)));
    assert!(matches!(old.put("k", "v"), Err(Error::NotLeader)));
    old.resign().unwrap(); // nothing to give up
    assert!(new.is_leader());
    assert_eq!(c.leader("e3b").unwrap().unwrap().value, b"v2");
}

/// One session never has two live guards over one key: a campaign from another thread
/// while this session leads re-campaigns (the old guard says it was superseded), and a
/// Mutex of the same name on the same session takes turns with the Leadership.
#[test]
fn one_session_never_has_two_live_guards_over_one_key() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let e = s.election("shared").unwrap();
    let l = e.campaign("main").unwrap();
    let (e2, m2) = (e.clone(), s.mutex("shared").unwrap());
    let other = std::thread::spawn(move || {
        let other = e2
            .campaign("thread")
            .expect("a re-campaign from another thread");
        assert!(other.is_leader());
        // The thread that holds the line asking for the Mutex of that name would wait on
        // itself: refused instead.
        assert!(matches!(m2.lock(), Err(Error::WouldDeadlock(_))));
        assert!(matches!(m2.try_lock(), Err(TryLockError::WouldBlock)));
        other
    })
    .join()
    .unwrap();
    assert!(!l.is_leader(), "the superseded guard must say so");
    assert_eq!(other.fencing_token(), l.fencing_token());
    drop(l); // no-op
    assert!(other.is_leader());
    assert_eq!(c.leader("shared").unwrap().unwrap().value, b"thread");
    let m = s.mutex("shared").unwrap();
    // Another thread waits for its turn instead.
    let m2 = m.clone();
    let waiter = std::thread::spawn(move || m2.lock().map(|g| g.fencing_token()));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished(), "the mutex was taken while leading");
    drop(other);
    let token = waiter
        .join()
        .unwrap()
        .expect("the mutex after the leadership");
    assert!(token > 0);
}

/// Item 6: with every member frozen, dropping a guard and resigning used to take one
/// request timeout per endpoint (3 s with three endpoints and a 1 s timeout).
#[test]
fn drop_and_resign_return_within_one_request_timeout_when_etcd_is_frozen() {
    let cl = cluster();
    let c = common::client_with_timeout(&cl.endpoints(), Duration::from_secs(1));
    let s = session(&c, 20);
    let g = s.mutex("frozen-m").unwrap().lock().unwrap();
    let mut l = s.election("frozen-e").unwrap().campaign("v").unwrap();
    for i in 0..3 {
        cl.pause(i).unwrap();
    }
    let start = Instant::now();
    drop(g);
    let dropped = start.elapsed();
    let start = Instant::now();
    let resigned = l.resign();
    let resign_took = start.elapsed();
    for i in 0..3 {
        cl.resume(i).unwrap();
    }
    assert!(
        dropped < Duration::from_millis(1600),
        "drop took {dropped:?}"
    );
    assert!(
        resign_took < Duration::from_millis(1600),
        "resign took {resign_took:?}"
    );
    assert!(
        matches!(resigned, Err(Error::Timeout { .. })),
        "{resigned:?}"
    );
    // Both go on in the background and finish once etcd answers; resign() confirms.
    assert!(eventually(Duration::from_secs(10), || l.resign().is_ok()));
    assert!(eventually(Duration::from_secs(10), || keys(&c, "frozen-").is_empty()));
}

fn etcdctl(endpoint: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(
        etcd_sync::testing::etcdctl_binary().expect("etcdctl (apt-get install etcd-client)"),
    )
    .env("ETCDCTL_API", "3")
    .arg("--endpoints")
    .arg(endpoint)
    .args(args)
    .output()
    .expect("run etcdctl")
}

/// Waits up to `limit` for `lost` to fire; returns how long it took.
fn fired_within(lost: &crossbeam_channel::Receiver<()>, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    match lost.recv_timeout(limit) {
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Some(start.elapsed()),
        _ => None,
    }
}

/// Guards follow their key: deleting it with `etcdctl del` ends the guard within a
/// second (the session is fine, so only the key tells).
#[test]
fn deleting_a_held_key_with_etcdctl_ends_the_guard_within_a_second() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 30);
    let g = s.mutex("del-m").unwrap().lock().unwrap();
    let l = s.election("del-e").unwrap().campaign("v").unwrap();
    let (g_lost, l_lost) = (g.lost(), l.lost());
    assert!(g.is_held() && l.is_leader());
    for key in [g.key_str().into_owned(), l.key_str().into_owned()] {
        let out = etcdctl(&server.endpoint(), &["del", &key]);
        assert!(out.status.success(), "{out:?}");
    }
    let took = fired_within(&g_lost, Duration::from_secs(1)).expect("mutex lost() fired");
    assert!(
        fired_within(&l_lost, Duration::from_secs(1)).is_some(),
        "leadership lost()"
    );
    assert!(!g.is_held() && !l.is_leader());
    assert!(s.is_alive(), "only the key was deleted");
    assert!(matches!(g.put("x", "y"), Err(Error::LockLost)));
    // Another session gets both at once.
    let other = session(&c, 30);
    assert!(other.mutex("del-m").unwrap().try_lock().is_ok());
    eprintln!("lost() fired {took:?} after the delete");
    // Dropping the lost guards deletes nothing of anyone else's.
    drop(g);
    drop(l);
}

/// A lease revoked elsewhere deletes our keys: guards report it within a second, before
/// the keep-alive finds out.
#[test]
fn a_lease_revoked_elsewhere_ends_the_guard_within_a_second() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 30);
    let g = s.mutex("revoked").unwrap().lock().unwrap();
    let lost = g.lost();
    let out = etcdctl(
        &server.endpoint(),
        &["lease", "revoke", &format!("{:x}", s.lease_id())],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(fired_within(&lost, Duration::from_secs(1)).is_some());
    assert!(!g.is_held());
}

/// Item 4: the enqueue times out on a frozen follower and succeeds on another member; when
/// the follower resumes it may apply the first attempt, re-creating our key after we
/// released it. No key may be left behind, and the next holder must not wait for our
/// session to end.
#[test]
fn a_late_applied_enqueue_leaves_no_key_behind() {
    let cl = cluster();
    let all = cl.endpoints();
    let leader = cl.leader().unwrap();
    let follower = (leader + 1) % all.len();
    let ordered: Vec<String> = (0..all.len())
        .map(|i| all[(follower + i) % all.len()].clone())
        .collect();
    let c = common::client_with_timeout(&ordered, Duration::from_millis(500));
    let s = session(&c, 20);
    let m = s.mutex("late").unwrap();
    cl.pause(follower).unwrap();
    let g = m.lock().expect("lock through another member");
    let token = g.fencing_token();
    g.release().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    cl.resume(follower).unwrap();
    let observer = Client::connect(&all[leader..=leader]).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || keys(&observer, "late/")
            .is_empty()),
        "our key is left behind: {:?}",
        observer.get_prefix("late/").unwrap()
    );
    let other = session(&observer, 20);
    let next = other
        .mutex("late")
        .unwrap()
        .lock_timeout(Duration::from_secs(3))
        .expect("the next holder does not wait for our session");
    assert!(next.fencing_token() > token);
    assert!(s.is_alive());
}

/// A lease revoked elsewhere, before the keep-alive noticed: the next lock and campaign
/// say the session is lost (etcd's `requested lease not found` for the enqueue), not an
/// etcd error, and mark the session lost for every other call.
#[test]
fn a_wait_on_a_lease_revoked_elsewhere_reports_the_session_lost() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 60);
    let out = etcdctl(
        &server.endpoint(),
        &["lease", "revoke", &format!("{:x}", s.lease_id())],
    );
    assert!(out.status.success(), "{out:?}");
    let locked = s.mutex("after-revoke").unwrap().lock();
    assert!(
        matches!(&locked, Err(Error::SessionLost(LossReason::Revoked))),
        "{locked:?}"
    );
    assert_eq!(s.loss_reason(), Some(LossReason::Revoked));
    let campaigned = s.election("after-revoke-e").unwrap().campaign("v");
    assert!(
        matches!(&campaigned, Err(Error::SessionLost(LossReason::Revoked))),
        "{campaigned:?}"
    );
    assert!(keys(&c, "after-revoke").is_empty());
}

/// Guard writes and re-campaigns send nothing once the session is known lost, although
/// etcd still shows our key (an orphaned session's lease lives until its TTL ends).
#[test]
fn guards_of_a_lost_session_write_nothing() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 30);
    let g = s.mutex("lost-writes").unwrap().lock().unwrap();
    let election = s.election("lost-writes-e").unwrap();
    let l = election.campaign("first").unwrap();
    // Bad input is refused before anything is sent.
    assert!(matches!(g.put("", "v"), Err(Error::InvalidArgument(_))));
    assert!(matches!(l.delete(""), Err(Error::InvalidArgument(_))));
    s.orphan();
    assert_eq!(
        keys(&c, "lost-writes").len(),
        2,
        "the keys outlive the keep-alive"
    );
    for result in [
        g.put("lost-writes-data", "v"),
        l.put("lost-writes-data", "v"),
    ] {
        assert!(
            matches!(&result, Err(Error::SessionLost(LossReason::Orphaned))),
            "{result:?}"
        );
    }
    assert!(matches!(
        l.proclaim("second"),
        Err(Error::SessionLost(LossReason::Orphaned))
    ));
    assert!(matches!(
        election.campaign("second"),
        Err(Error::SessionLost(LossReason::Orphaned))
    ));
    assert!(c.get("lost-writes-data").unwrap().is_none());
    assert_eq!(
        c.get(l.key()).unwrap().unwrap().value,
        b"first",
        "nothing was proclaimed"
    );
}

/// Item 6 of the newcomer issue: with etcd frozen, `try_lock()` must give up after about
/// one request timeout (one endpoint), not several.
#[test]
fn try_lock_on_a_frozen_etcd_gives_up_after_one_request_timeout() {
    let server = etcd();
    let c = common::client_with_timeout(&server.endpoints(), Duration::from_secs(1));
    let s = session(&c, 20);
    let m = s.mutex("frozen-try").unwrap();
    server.pause().unwrap();
    let start = Instant::now();
    let tried = m.try_lock();
    let took = start.elapsed();
    let start = Instant::now();
    let timed = m.lock_timeout(Duration::from_millis(500));
    let timed_took = start.elapsed();
    server.resume().unwrap();
    eprintln!("try_lock {took:?}, lock_timeout(500ms) {timed_took:?}");
    assert!(
        matches!(&tried, Err(TryLockError::Error(e)) if e.is_retryable()),
        "{tried:?}"
    );
    assert!(took < Duration::from_millis(1600), "try_lock took {took:?}");
    assert!(timed.as_ref().is_err_and(Error::is_timeout), "{timed:?}");
    assert!(
        timed_took < Duration::from_millis(1100),
        "lock_timeout took {timed_took:?}"
    );
    // Nothing is left once etcd answers again, and the lock is free as soon as the
    // cleanups running in the background (they own the turn) have their answers.
    assert!(eventually(Duration::from_secs(10), || keys(
        &c,
        "frozen-try"
    )
    .is_empty()));
    let mut outcomes = Vec::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            let tried = m.try_lock();
            let free = tried.is_ok();
            outcomes.push(format!("{:?}", tried.err()));
            free
        }),
        "try_lock never succeeded: {outcomes:?}"
    );
}

/// Issue 25, defect 5: a release that times out on a frozen etcd says how long it waited
/// (it said "timed out after 0ns": the first attempt used up the whole bound, and the
/// error reported what was left of it).
#[test]
fn a_release_that_times_out_reports_the_time_it_waited() {
    let server = etcd();
    let timeout = Duration::from_secs(1);
    let c = common::client_with_timeout(&server.endpoints(), timeout);
    let s = session(&c, 20);
    let g = s.mutex("frozen-after").unwrap().lock().unwrap();
    server.pause().unwrap();
    let start = Instant::now();
    let unlocked = g.release();
    let took = start.elapsed();
    server.resume().unwrap();
    match unlocked {
        Err(Error::Timeout { after, .. }) => assert!(
            after >= timeout.mul_f32(0.9) && after <= took + Duration::from_millis(10),
            "a release that waited {took:?} reports 'timed out after {after:?}'"
        ),
        other => panic!("expected a release timeout, got {other:?}"),
    }
    assert!(
        took < timeout + Duration::from_millis(600),
        "unlock took {took:?}"
    );
    assert!(eventually(Duration::from_secs(10), || keys(
        &c,
        "frozen-after/"
    )
    .is_empty()));
}

/// Issue 25, defect 2 (second half): a guard that waited for its turn follows its key from
/// the revision that proved its ownership at once, not after the 200 ms deferral of an
/// uncontended hold; a delete right after the handoff ends it as soon as the event arrives.
#[test]
fn a_guard_that_waited_follows_its_key_at_once() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (a, b) = (session(&c, 30), session(&c, 30));
    let mut worst = Duration::ZERO;
    for round in 0..5 {
        let name = format!("at-once-{round}");
        let held = a.mutex(&name).unwrap().lock().unwrap();
        let mutex = b.mutex(&name).unwrap();
        let waiter = std::thread::spawn(move || mutex.lock_timeout(Duration::from_secs(10)));
        assert!(eventually(Duration::from_secs(5), || keys(
            &c,
            &format!("{name}/")
        )
        .len()
            == 2));
        held.release().unwrap();
        let guard = waiter.join().unwrap().unwrap();
        let lost = guard.lost();
        c.delete(guard.key()).unwrap();
        let deleted = Instant::now();
        let fired = fired_within(&lost, Duration::from_secs(2));
        let took = fired.map(|_| deleted.elapsed());
        assert!(
            took.is_some(),
            "round {round}: the guard never noticed its key was deleted"
        );
        worst = worst.max(took.unwrap_or_default());
        assert!(!guard.is_held());
    }
    // The deferral alone would be 200 ms; an event on a running watcher takes a few ms.
    assert!(
        worst < Duration::from_millis(150),
        "a deleted key was noticed after {worst:?}"
    );
}

/// Issue 48, item 5: how long a delete of an uncontended guard's key takes to show in
/// `lost()`, right after the acquire and after a hold of 300 ms. RELIABILITY.md states both
/// figures; this pins them with room (the promise is one second).
#[test]
fn a_deleted_key_is_reported_as_documented_young_or_old() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 30);
    let measure = |name: &str, held_for: Duration| {
        let guard = s.mutex(name).unwrap().lock().unwrap();
        let lost = guard.lost();
        std::thread::sleep(held_for);
        c.delete(guard.key()).unwrap();
        let deleted = Instant::now();
        let fired = fired_within(&lost, Duration::from_secs(2));
        assert!(fired.is_some(), "{name}: the loss was never reported");
        deleted.elapsed()
    };
    let mut young = Vec::new();
    let mut old = Vec::new();
    for round in 0..8 {
        young.push(measure(&format!("young-{round}"), Duration::ZERO));
        old.push(measure(&format!("old-{round}"), Duration::from_millis(300)));
    }
    young.sort();
    old.sort();
    eprintln!("loss reported, right after the acquire: {young:?}");
    eprintln!("loss reported, after a 300 ms hold: {old:?}");
    // Documented: about 25 ms for a hold older than 200 ms (150 ms with room for a busy
    // machine), at most the deferral plus one read for a younger one (500 ms with room).
    assert!(old[old.len() / 2] < Duration::from_millis(150), "{old:?}");
    assert!(
        young[young.len() / 2] < Duration::from_millis(500),
        "{young:?}"
    );
    assert!(
        young
            .iter()
            .chain(&old)
            .all(|t| *t < Duration::from_secs(1))
    );
}
