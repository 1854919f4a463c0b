//! DoubleBarrier: entering and leaving together, participants counted out.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::common::{client, etcd, eventually, keys, session};
use super::{BACKSTOP, returned, spawn, still_blocked};
use etcd_sync::{CancelToken, Error, Operation, TryLockError, WaitOptions};

/// `count` participants on their own clients and sessions enter at staggered times and
/// leave at staggered times: nobody's enter returns before the last one arrived, nobody's
/// leave before the last one left, and nothing is left under the name.
#[test]
fn double_barrier_participants_enter_together_and_leave_together() {
    const COUNT: usize = 3;
    let server = etcd();
    let endpoints = server.endpoints();
    let step = Duration::from_millis(300);
    let threads: Vec<_> = (0..COUNT)
        .map(|i| {
            let endpoints = endpoints.clone();
            spawn(move || {
                let c = client(&endpoints);
                let s = session(&c, 10);
                let b = s.double_barrier("rendezvous", COUNT).unwrap();
                thread::sleep(step * i as u32);
                let arrived = Instant::now();
                b.enter_timeout(BACKSTOP).unwrap();
                let entered = Instant::now();
                assert!(b.is_entered());
                // Leave in the opposite order of arrival.
                thread::sleep(step * (COUNT - 1 - i) as u32);
                let leaving = Instant::now();
                b.leave_timeout(BACKSTOP).unwrap();
                (arrived, entered, leaving, Instant::now())
            })
        })
        .collect();
    let times: Vec<_> = threads
        .iter()
        .map(|t| returned(t, "a participant").0)
        .collect();
    let last_arrival = times.iter().map(|t| t.0).max().unwrap();
    let last_leave = times.iter().map(|t| t.2).max().unwrap();
    for (i, (_, entered, _, left)) in times.iter().enumerate() {
        assert!(
            *entered >= last_arrival,
            "participant {i} entered before the last arrived"
        );
        let lag = entered.duration_since(last_arrival);
        assert!(
            lag < Duration::from_secs(2),
            "participant {i} entered {lag:?} late"
        );
        assert!(
            *left >= last_leave,
            "participant {i} left before the last one called leave"
        );
        assert!(left.duration_since(last_leave) < Duration::from_secs(2));
    }
    let c = client(&endpoints);
    assert_eq!(
        keys(&c, "rendezvous/"),
        Vec::<String>::new(),
        "leftover keys"
    );
}

/// Twelve participants on two clients (sharing each client's watch stream) all enter and
/// leave; nobody enters before the twelfth joined.
#[test]
fn a_dozen_participants_on_two_clients() {
    const COUNT: usize = 12;
    let server = etcd();
    let clients = [client(&server.endpoints()), client(&server.endpoints())];
    let started = Instant::now();
    let participants: Vec<_> = (0..COUNT)
        .map(|i| {
            let s = session(&clients[i % 2], 10);
            let b = s.double_barrier("dozen", COUNT).unwrap();
            thread::sleep(Duration::from_millis(20));
            let joined = Instant::now();
            (
                joined,
                spawn(move || {
                    b.enter_timeout(BACKSTOP)?;
                    let entered = Instant::now();
                    b.leave_timeout(BACKSTOP)?;
                    Ok::<_, Error>(entered)
                }),
            )
        })
        .collect();
    let last_joined = participants.iter().map(|p| p.0).max().unwrap();
    for (_, p) in &participants {
        let entered = returned(p, "a participant").0.unwrap();
        assert!(entered >= last_joined, "entered before the twelfth joined");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(keys(&clients[0], "dozen/"), Vec::<String>::new());
}

#[test]
fn a_participant_whose_session_ends_while_entering_is_counted_out() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (a, b, d, e) = (
        session(&c, 10),
        session(&c, 10),
        session(&c, 10),
        session(&c, 10),
    );
    let ab = a.double_barrier("fill", 3).unwrap();
    let bb = Arc::new(b.double_barrier("fill", 3).unwrap());
    let a_enter = spawn(move || ab.enter_timeout(BACKSTOP).map(|()| ab));
    let b_enter = {
        let bb = bb.clone();
        spawn(move || bb.enter_timeout(BACKSTOP))
    };
    assert!(eventually(Duration::from_secs(5), || keys(&c, "fill/")
        .len()
        == 2));
    // B's session ends before the round fills: its enter fails, its key is gone.
    b.close().unwrap();
    let (result, _) = returned(&b_enter, "B's enter");
    assert!(result.unwrap_err().is_session_lost());
    assert_eq!(keys(&c, "fill/").len(), 1);
    // A is not let in by B's (dead) key: two more are needed.
    let db = d.double_barrier("fill", 3).unwrap();
    let d_enter = spawn(move || db.enter_timeout(BACKSTOP).map(|()| db));
    still_blocked(
        &a_enter,
        Duration::from_millis(400),
        "A's enter with 2 of 3 in",
    );
    let eb = e.double_barrier("fill", 3).unwrap();
    eb.enter_timeout(BACKSTOP).unwrap();
    let ab = returned(&a_enter, "A's enter").0.unwrap();
    let db = returned(&d_enter, "D's enter").0.unwrap();
    // Everyone leaves; nothing is left.
    let leaves: Vec<_> = [ab, db]
        .into_iter()
        .map(|b| spawn(move || b.leave_timeout(BACKSTOP)))
        .collect();
    eb.leave_timeout(BACKSTOP).unwrap();
    for l in &leaves {
        returned(l, "a leave").0.unwrap();
    }
    assert_eq!(keys(&c, "fill/"), Vec::<String>::new());
}

#[test]
fn a_participant_whose_session_ends_inside_is_counted_out_of_leaving() {
    let server = etcd();
    let c = client(&server.endpoints());
    // C's lease is short: orphaned, it expires on the server within about 2 s.
    let (a, b, closed, orphaned) = (
        session(&c, 10),
        session(&c, 10),
        session(&c, 10),
        session(&c, 2),
    );
    let parts: Vec<_> = [&a, &b, &closed, &orphaned]
        .into_iter()
        .map(|s| {
            let b = s.double_barrier("shrink", 4).unwrap();
            spawn(move || b.enter_timeout(BACKSTOP).map(|()| b))
        })
        .collect();
    let mut parts: Vec<_> = parts
        .iter()
        .map(|p| returned(p, "an enter").0.unwrap())
        .collect();
    // Kept (not dropped: that would remove their keys) until the end of the test.
    let (_orphaned_part, _closed_part) = (parts.pop().unwrap(), parts.pop().unwrap());
    let leaves: Vec<_> = parts
        .into_iter()
        .map(|b| spawn(move || b.leave_timeout(BACKSTOP)))
        .collect();
    for l in &leaves {
        still_blocked(
            l,
            Duration::from_millis(300),
            "a leave while two are inside",
        );
    }
    // One ends by close (its key goes at once), one by expiry (orphan: no keep-alive).
    closed.close().unwrap();
    for l in &leaves {
        still_blocked(l, Duration::from_millis(300), "a leave while one is inside");
    }
    let orphaned_at = Instant::now();
    orphaned.orphan();
    for l in &leaves {
        let (result, at) = returned(l, "a leave after the last session ended");
        result.unwrap();
        let after = at.duration_since(orphaned_at);
        assert!(
            after < Duration::from_secs(6),
            "left {after:?} after the orphan"
        );
    }
    assert_eq!(keys(&c, "shrink/"), Vec::<String>::new());
}

/// A participant that fills the round and ends its session at once still let the other
/// in: the round filled, whatever became of it since.
#[test]
fn a_round_that_filled_lets_everyone_in_even_if_its_last_one_left_at_once() {
    let server = etcd();
    let c = client(&server.endpoints());
    let waiter = session(&c, 10).double_barrier("brief", 2).unwrap();
    let w = spawn(move || waiter.enter_timeout(BACKSTOP).map(|()| waiter));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "brief/")
        .len()
        == 1));
    let other = client(&server.endpoints());
    let s = session(&other, 10);
    s.double_barrier("brief", 2)
        .unwrap()
        .enter_timeout(BACKSTOP)
        .unwrap();
    s.close().unwrap();
    let waiter = returned(&w, "the waiter's enter").0.unwrap();
    waiter.leave_timeout(BACKSTOP).unwrap();
    assert_eq!(keys(&c, "brief/"), Vec::<String>::new());
}

#[test]
fn a_latecomer_waits_for_the_next_round() {
    let server = etcd();
    let c = client(&server.endpoints());
    let sessions: Vec<_> = (0..4).map(|_| session(&c, 10)).collect();
    let [a, b, late, fourth] =
        [0, 1, 2, 3].map(|i| sessions[i].double_barrier("rounds", 2).unwrap());
    let a_enter = spawn(move || a.enter_timeout(BACKSTOP).map(|()| a));
    b.enter_timeout(BACKSTOP).unwrap();
    let a = returned(&a_enter, "A's enter").0.unwrap();
    // The round of A and B is on: a third waits, though two keys besides its own exist.
    let late_enter = spawn(move || late.enter_timeout(BACKSTOP).map(|()| late));
    still_blocked(
        &late_enter,
        Duration::from_millis(400),
        "a latecomer's enter",
    );
    // A leaves; the latecomer is not in A's round, so A waits only for B.
    let a_leave = spawn(move || a.leave_timeout(BACKSTOP));
    still_blocked(
        &a_leave,
        Duration::from_millis(300),
        "A's leave while B is in",
    );
    b.leave_timeout(BACKSTOP).unwrap();
    returned(&a_leave, "A's leave").0.unwrap();
    // The round is over; the latecomer now waits for a partner of its own round.
    still_blocked(&late_enter, Duration::from_millis(300), "a latecomer alone");
    fourth.enter_timeout(BACKSTOP).unwrap();
    let late = returned(&late_enter, "the latecomer's enter").0.unwrap();
    let l = spawn(move || late.leave_timeout(BACKSTOP));
    fourth.leave_timeout(BACKSTOP).unwrap();
    returned(&l, "the latecomer's leave").0.unwrap();
    assert_eq!(keys(&c, "rounds/"), Vec::<String>::new());
}

#[test]
fn double_barrier_limits_cancels_and_try_enter_leave_no_key() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (a, b) = (session(&c, 10), session(&c, 10));
    let ab = a.double_barrier("limits", 2).unwrap();
    let started = Instant::now();
    let e = ab.enter_timeout(Duration::from_millis(300)).unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(
            e,
            Error::Timeout {
                operation: Operation::Enter,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(
        keys(&c, "limits/"),
        Vec::<String>::new(),
        "a timed-out enter left its key"
    );

    let token = CancelToken::new();
    let canceller = token.clone();
    thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        canceller.cancel();
    });
    let started = Instant::now();
    let e = ab
        .enter_with(WaitOptions::new().timeout(BACKSTOP).cancel_token(&token))
        .unwrap_err();
    assert!(e.is_cancelled(), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        keys(&c, "limits/"),
        Vec::<String>::new(),
        "a cancelled enter left its key"
    );

    assert!(matches!(ab.try_enter(), Err(TryLockError::WouldBlock)));
    assert_eq!(
        keys(&c, "limits/"),
        Vec::<String>::new(),
        "try_enter left its key"
    );
    assert!(!ab.is_entered());

    // With B waiting, A's try_enter fills the round.
    let bb = b.double_barrier("limits", 2).unwrap();
    let b_enter = spawn(move || bb.enter_timeout(BACKSTOP).map(|()| bb));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "limits/")
        .len()
        == 1));
    ab.try_enter().unwrap();
    let bb = returned(&b_enter, "B's enter").0.unwrap();
    // Leaving: a limit and a cancel end the wait for the others; we are out all the same.
    let started = Instant::now();
    let e = ab.leave_timeout(Duration::from_millis(300)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Timeout {
                operation: Operation::Leave,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(!ab.is_entered());
    assert_eq!(keys(&c, "limits/").len(), 2, "B's key and the ready key");
    bb.leave_with(&CancelToken::new()).unwrap();
    assert_eq!(keys(&c, "limits/"), Vec::<String>::new());
}

/// On a frozen etcd, an enter with a limit still returns about at its limit (its join is
/// cut short, and the removal of a key it may have created goes on in the background), and
/// once etcd is back no key is left; a leave whose removal was not confirmed keeps the
/// participant in, to leave again.
#[test]
fn waits_cut_short_on_a_frozen_etcd_return_in_time_and_leave_no_key() {
    let server = etcd();
    let c = client(&server.endpoints()); // request timeout 3 s
    let s = session(&c, 20);
    let b = s.double_barrier("frozen-enter", 2).unwrap();
    server.pause().unwrap();
    let started = Instant::now();
    let e = b.enter_timeout(Duration::from_millis(500)).unwrap_err();
    let took = started.elapsed();
    server.resume().unwrap();
    assert!(e.is_wait_timeout(), "{e:?}");
    // The limit, plus at most a quarter of the request timeout for the removal.
    assert!(took < Duration::from_millis(500 + 750 + 500), "{took:?}");
    // etcd may apply the join it had when it froze only now; the sweep removes that key
    // as soon as it appears. (A participant joining in between would count it.)
    thread::sleep(Duration::from_millis(500));
    assert!(
        eventually(Duration::from_secs(10), || keys(&c, "frozen-enter/")
            .is_empty()),
        "left {:?}",
        keys(&c, "frozen-enter/")
    );
    // The participant can enter later as usual.
    let other = session(&c, 10);
    let ob = other.double_barrier("frozen-enter", 2).unwrap();
    let w = spawn(move || ob.enter_timeout(BACKSTOP).map(|()| ob));
    b.enter_timeout(BACKSTOP).unwrap();
    let ob = returned(&w, "the other's enter").0.unwrap();
    // A leave whose removal etcd does not confirm in time keeps us in: leave again.
    server.pause().unwrap();
    let e = b.leave_timeout(Duration::from_millis(300)).unwrap_err();
    server.resume().unwrap();
    assert!(e.is_wait_timeout(), "{e:?}");
    assert!(
        b.is_entered(),
        "out, though etcd never confirmed our key's removal"
    );
    let l = spawn(move || ob.leave_timeout(BACKSTOP));
    b.leave_timeout(BACKSTOP).unwrap();
    returned(&l, "a leave").0.unwrap();
    assert!(keys(&c, "frozen-enter/").is_empty());
}

#[test]
fn nothing_is_left_when_the_sessions_end_inside() {
    let server = etcd();
    let c = client(&server.endpoints());
    let sessions: Vec<_> = (0..3).map(|_| session(&c, 10)).collect();
    let enters: Vec<_> = sessions
        .iter()
        .map(|s| {
            let b = s.double_barrier("abandoned", 3).unwrap();
            spawn(move || b.enter_timeout(BACKSTOP).map(|()| b))
        })
        .collect();
    let inside: Vec<_> = enters
        .iter()
        .map(|e| returned(e, "an enter").0.unwrap())
        .collect();
    assert_eq!(
        keys(&c, "abandoned/").len(),
        4,
        "three participants and the ready key"
    );
    for s in &sessions {
        s.close().unwrap();
    }
    assert_eq!(keys(&c, "abandoned/"), Vec::<String>::new());
    drop(inside);
    // Dropping a participant that entered removes its key.
    let s = session(&c, 10);
    let solo = s.double_barrier("dropped", 1).unwrap();
    solo.enter().unwrap();
    assert_eq!(keys(&c, "dropped/").len(), 2);
    drop(solo);
    assert!(eventually(Duration::from_secs(5), || keys(&c, "dropped/").is_empty()));
}

/// Issue 48, item 7 (Curator admits every participant that joins at once): six join a
/// double barrier of five together. The five oldest enter; the sixth, over the count, is
/// the first of the next round: its `enter_timeout` ends with `Timeout` (and leaves no
/// key) unless the round is filled by others, which lets it in once the five have left.
#[test]
fn over_the_count_the_newest_waits_for_the_next_round() {
    let server = etcd();
    let c = client(&server.endpoints());
    let sessions: Vec<_> = (0..10).map(|_| session(&c, 10)).collect();
    let go = std::sync::Arc::new(std::sync::Barrier::new(6));
    let joins: Vec<_> = (0..6)
        .map(|i| {
            let barrier = sessions[i].double_barrier("six", 5).unwrap();
            let go = go.clone();
            spawn(move || {
                go.wait();
                let result = barrier.enter_timeout(Duration::from_secs(3));
                (result, barrier)
            })
        })
        .collect();
    let results: Vec<_> = joins.iter().map(|rx| returned(rx, "an enter").0).collect();
    let (entered, over): (Vec<_>, Vec<_>) = results.into_iter().partition(|(r, _)| r.is_ok());
    assert_eq!((entered.len(), over.len()), (5, 1), "{:?}", over);
    let (result, sixth) = over.into_iter().next().expect("the sixth");
    assert!(
        matches!(result, Err(Error::Timeout { .. })),
        "the sixth: {result:?}"
    );
    assert!(!sixth.is_entered());
    // Its timed-out enter left no key: the five and the ready key remain.
    assert_eq!(keys(&c, "six/").len(), 6, "{:?}", keys(&c, "six/"));
    // The five leave together.
    let leaves: Vec<_> = entered
        .into_iter()
        .map(|(_, barrier)| spawn(move || barrier.leave_timeout(BACKSTOP)))
        .collect();
    for leave in &leaves {
        returned(leave, "a leave").0.unwrap();
    }
    // The sixth enters the next round once four others join it.
    let sixth_enter = spawn(move || sixth.enter_timeout(BACKSTOP).map(|()| sixth));
    let others: Vec<_> = (6..10)
        .map(|i| {
            let barrier = sessions[i].double_barrier("six", 5).unwrap();
            spawn(move || barrier.enter_timeout(BACKSTOP).map(|()| barrier))
        })
        .collect();
    let sixth = returned(&sixth_enter, "the sixth's enter").0.unwrap();
    let mut round: Vec<_> = others
        .iter()
        .map(|rx| returned(rx, "an enter").0.unwrap())
        .collect();
    round.push(sixth);
    let leaves: Vec<_> = round
        .into_iter()
        .map(|barrier| spawn(move || barrier.leave_timeout(BACKSTOP)))
        .collect();
    for leave in &leaves {
        returned(leave, "a leave").0.unwrap();
    }
    assert_eq!(keys(&c, "six/"), Vec::<String>::new());
}
