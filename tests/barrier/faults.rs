//! Bad input, compaction, restarts and a frozen member under barrier waits.

use std::thread;
use std::time::{Duration, Instant};

use super::common::{self, client, etcd, eventually, keys, session};
use super::{BACKSTOP, returned, spawn, still_blocked};

#[test]
fn bad_input_is_a_clear_error() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    assert!(c.barrier("").unwrap_err().is_invalid_argument());
    assert!(c.count_down_latch("").unwrap_err().is_invalid_argument());
    assert!(s.double_barrier("", 2).unwrap_err().is_invalid_argument());
    assert!(s.double_barrier("x", 0).unwrap_err().is_invalid_argument());
    assert!(
        c.barrier(vec![b'a'; 5000])
            .unwrap_err()
            .is_invalid_argument()
    );
    let latch = c.count_down_latch("l").unwrap();
    assert!(latch.try_set_count(0).unwrap_err().is_invalid_argument());

    // A latch key that holds no count.
    c.put("l", "not a number").unwrap();
    for result in [
        latch.count().map(|_| ()),
        latch.count_down().map(|_| ()),
        latch.wait(),
    ] {
        let e = result.unwrap_err();
        assert!(
            e.is_invalid_argument() && e.to_string().contains("not a latch count"),
            "{e}"
        );
    }

    // Leaving without entering, entering twice.
    let one = s.double_barrier("once", 1).unwrap();
    assert!(one.leave().unwrap_err().is_invalid_argument());
    one.enter().unwrap();
    assert!(one.enter().unwrap_err().is_invalid_argument());
    one.leave().unwrap();

    // Participants that disagree on the count: the younger refuses (and leaves no key),
    // the older goes on without counting it.
    let (s3, s2, s3b) = (session(&c, 10), session(&c, 10), session(&c, 10));
    let older = s3.double_barrier("counts", 2).unwrap();
    let waiting_older = spawn(move || older.enter_timeout(BACKSTOP).map(|()| older));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "counts/")
        .len()
        == 1));
    let e = s2
        .double_barrier("counts", 3)
        .unwrap()
        .enter_timeout(BACKSTOP)
        .unwrap_err();
    assert!(
        e.is_invalid_argument() && e.to_string().contains("expects 2"),
        "{e}"
    );
    assert_eq!(
        keys(&c, "counts/").len(),
        1,
        "the refused participant left its key"
    );
    still_blocked(
        &waiting_older,
        Duration::from_millis(200),
        "the older participant",
    );
    let partner = s3b.double_barrier("counts", 2).unwrap();
    partner.enter_timeout(BACKSTOP).unwrap();
    let older = returned(&waiting_older, "the older participant's enter")
        .0
        .unwrap();
    let l = spawn(move || older.leave_timeout(BACKSTOP));
    partner.leave_timeout(BACKSTOP).unwrap();
    returned(&l, "a leave").0.unwrap();

    // Keys under a double barrier's prefix that no double barrier wrote: found at the
    // join, and while waiting (from the events); our key is removed either way.
    c.put("dirty/notes", "x").unwrap();
    let b = s.double_barrier("dirty", 2).unwrap();
    let e = b.enter_timeout(BACKSTOP).unwrap_err();
    assert!(
        e.is_invalid_argument() && e.to_string().contains("dirty/notes"),
        "{e}"
    );
    assert_eq!(keys(&c, "dirty/"), vec!["dirty/notes".to_string()]);
    let b = s.double_barrier("spoiled", 2).unwrap();
    let waiting = spawn(move || b.enter_timeout(BACKSTOP));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "spoiled/")
        .len()
        == 1));
    c.put("spoiled/ready", "soon").unwrap();
    let e = returned(&waiting, "an enter that met a foreign key")
        .0
        .unwrap_err();
    assert!(
        e.is_invalid_argument() && e.to_string().contains("spoiled/ready"),
        "{e}"
    );
    assert_eq!(keys(&c, "spoiled/"), vec!["spoiled/ready".to_string()]);
}

/// Waits ride out compaction and a restart of etcd: their watcher's resume revision is
/// compacted while the stream is down, so it starts again from now and each wait reads once
/// (the gap) instead of missing the release that comes after.
#[test]
fn waits_outlive_compaction_and_a_restart() {
    let server = etcd();
    let c = common::try_client_for(&server.endpoints(), Duration::from_secs(2)).unwrap();
    let barrier = c.barrier("compacted").unwrap();
    barrier.hold().unwrap();
    let w = {
        let b = c.barrier("compacted").unwrap();
        spawn(move || b.wait_timeout(Duration::from_secs(25)))
    };
    let latch = c.count_down_latch("compacted-latch").unwrap();
    latch.try_set_count(1).unwrap();
    let lw = {
        let l = c.count_down_latch("compacted-latch").unwrap();
        spawn(move || l.wait_timeout(Duration::from_secs(25)))
    };
    let (a, b) = (session(&c, 20), session(&c, 20));
    let first = a.double_barrier("compacted-db", 2).unwrap();
    let dw = spawn(move || first.enter_timeout(Duration::from_secs(25)).map(|()| first));
    still_blocked(&w, Duration::from_millis(500), "a wait on a held barrier");
    let rev = (0..20)
        .map(|i| c.put("churn", i.to_string()).unwrap())
        .max()
        .unwrap();
    c.compact(rev).unwrap();
    server.kill().unwrap();
    server.restart().unwrap();
    assert!(eventually(Duration::from_secs(10), || c.get("x").is_ok()));
    thread::sleep(Duration::from_secs(1));
    let released = Instant::now();
    barrier.release().unwrap();
    latch.count_down().unwrap();
    let second = b.double_barrier("compacted-db", 2).unwrap();
    second.enter_timeout(BACKSTOP).unwrap();
    let bound = Duration::from_secs(3);
    let (result, at) = returned(&w, "a barrier wait after compaction and a restart");
    result.unwrap();
    assert!(
        at.duration_since(released) < bound,
        "{:?}",
        at.duration_since(released)
    );
    let (result, at) = returned(&lw, "a latch wait after compaction and a restart");
    result.unwrap();
    assert!(
        at.duration_since(released) < bound,
        "{:?}",
        at.duration_since(released)
    );
    let (first, at) = returned(&dw, "an enter after compaction and a restart");
    let first = first.unwrap();
    assert!(
        at.duration_since(released) < bound,
        "{:?}",
        at.duration_since(released)
    );
    let l = spawn(move || first.leave_timeout(BACKSTOP));
    second.leave_timeout(BACKSTOP).unwrap();
    returned(&l, "a leave").0.unwrap();
    assert_eq!(keys(&c, "compacted-db/"), Vec::<String>::new());
}

/// The release happens while the waiters' member is frozen, and its history is compacted
/// before their client fails over: the watcher cannot resume, starts again from now, and
/// only the read that closes the gap can tell the waiters the barrier, the latch and the
/// round are open. Without it they would wait until their limit.
#[test]
fn a_release_missed_by_a_frozen_member_is_read_after_the_failover() {
    let cl = common::cluster();
    let all = cl.endpoints();
    let leader = cl.leader().expect("the cluster's leader");
    let frozen = (leader + 1) % all.len();
    let from = |first: usize| -> Vec<String> {
        (0..all.len())
            .map(|i| all[(first + i) % all.len()].clone())
            .collect()
    };
    // The waiters' client talks to `frozen` first; a session makes its keep-alive notice.
    let c = common::try_client_for(&from(frozen), Duration::from_secs(1)).unwrap();
    let s = session(&c, 4);
    let other = common::try_client_for(&from(leader), Duration::from_secs(2)).unwrap();
    let limit = Duration::from_secs(25);
    other.barrier("frozen").unwrap().hold().unwrap();
    let latch = other.count_down_latch("frozen-latch").unwrap();
    latch.try_set_count(1).unwrap();
    let w = {
        let b = c.barrier("frozen").unwrap();
        spawn(move || b.wait_timeout(limit))
    };
    let lw = {
        let l = c.count_down_latch("frozen-latch").unwrap();
        spawn(move || l.wait_timeout(limit))
    };
    let first = s.double_barrier("frozen-db", 2).unwrap();
    let dw = spawn(move || first.enter_timeout(limit).map(|()| first));
    still_blocked(&w, Duration::from_millis(500), "a wait on a held barrier");
    cl.pause(frozen).unwrap();
    let released = Instant::now();
    other.barrier("frozen").unwrap().release().unwrap();
    latch.count_down().unwrap();
    let t = session(&other, 10);
    let second = t.double_barrier("frozen-db", 2).unwrap();
    second.enter_timeout(BACKSTOP).unwrap();
    let rev = (0..20)
        .map(|i| other.put("churn", i.to_string()).unwrap())
        .max()
        .unwrap();
    other.compact(rev).unwrap();
    let bound = Duration::from_secs(10);
    let (result, at) = returned(&w, "a barrier wait");
    result.unwrap();
    assert!(
        at.duration_since(released) < bound,
        "{:?}",
        at.duration_since(released)
    );
    returned(&lw, "a latch wait").0.unwrap();
    let first = returned(&dw, "an enter").0.unwrap();
    cl.resume(frozen).unwrap();
    let l = spawn(move || first.leave_timeout(BACKSTOP));
    second.leave_timeout(BACKSTOP).unwrap();
    returned(&l, "a leave").0.unwrap();
}
