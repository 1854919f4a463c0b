//! The supervised leader loop (issue 15, part 2) against real etcd: terms across a revoked
//! lease and a killed member with callbacks in order and never two leaders, cancel while
//! leading and while campaigning, a panicking closure, and the health check.
//!
//! "Never two leaders" is judged by etcd itself: every term writes through its
//! leadership's guarded `put`, which commits only while the key is the leader's. Sorted by
//! revision, the successful writes must carry non-decreasing fencing tokens: a write of an
//! older term after a newer term's would be two leaders.

#![cfg(feature = "testing")]

mod common;

use std::sync::{Arc, Mutex as StdMutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::{client, cluster, etcdctl_command, eventually, keys, session, try_client_for};
use etcd_sync::crossbeam_channel::select;
use etcd_sync::{CancelToken, Client, LoopState, TermEnd};

/// What a loop reported, in order: `Elected(token)` and `Ended(reason)`.
#[derive(Debug, Clone)]
enum Report {
    Elected(i64),
    Ended(String),
}

/// One loop on its own thread, with its reports and its successful guarded writes.
struct Candidate {
    cancel: CancelToken,
    reports: Arc<StdMutex<Vec<Report>>>,
    /// (revision of the write, fencing token of the term that made it)
    writes: Arc<StdMutex<Vec<(i64, i64)>>>,
    health: Arc<StdMutex<Option<etcd_sync::LoopHealth>>>,
    /// The leaders `on_leader_changed` saw, by value.
    changes: Arc<StdMutex<Vec<String>>>,
    thread: JoinHandle<etcd_sync::Result<()>>,
}

/// Starts a loop on `client` that writes `<name>-log` every 20 ms while leading, and
/// panics in its first term if `panic_first`.
fn candidate(client: Client, name: &'static str, me: &'static str, panic_first: bool) -> Candidate {
    let cancel = CancelToken::new();
    let reports = Arc::new(StdMutex::new(Vec::new()));
    let writes = Arc::new(StdMutex::new(Vec::new()));
    let health = Arc::new(StdMutex::new(None));
    let changes = Arc::new(StdMutex::new(Vec::new()));
    let ch = changes.clone();
    let (c, r1, r2, w, h) = (
        cancel.clone(),
        reports.clone(),
        reports.clone(),
        writes.clone(),
        health.clone(),
    );
    let thread = thread::spawn(move || {
        let session = client
            .session_builder()
            .ttl(Duration::from_secs(3))
            .start()?;
        let election = session.election(name)?;
        let leader_loop = election
            .leader_loop(me)
            .backoff(Duration::from_millis(50), Duration::from_millis(400))
            .wedged_after(Duration::from_secs(1))
            .on_elected(move |l| r1.lock().unwrap().push(Report::Elected(l.fencing_token())))
            .on_lost(move |end| r2.lock().unwrap().push(Report::Ended(format!("{end:?}"))))
            .on_leader_changed(move |event| {
                if let etcd_sync::LeaderEvent::Elected(l) = event {
                    ch.lock().unwrap().push(l.value_str().into_owned());
                }
            });
        *h.lock().unwrap() = Some(leader_loop.health());
        let mut terms = 0;
        leader_loop.run(&c, |leadership, cancel| {
            terms += 1;
            if panic_first && terms == 1 {
                panic!("boom in the first term");
            }
            loop {
                if let Ok(rev) = leadership.put(format!("{name}-log"), me) {
                    w.lock().unwrap().push((rev, leadership.fencing_token()));
                }
                select! {
                    recv(leadership.lost()) -> _ => return,
                    recv(cancel.cancelled()) -> _ => return,
                    default(Duration::from_millis(20)) => {}
                }
            }
        })
    });
    Candidate {
        cancel,
        reports,
        writes,
        health,
        changes,
        thread,
    }
}

impl Candidate {
    fn reports(&self) -> Vec<Report> {
        self.reports.lock().unwrap().clone()
    }

    fn elected(&self) -> usize {
        self.reports()
            .iter()
            .filter(|r| matches!(r, Report::Elected(_)))
            .count()
    }

    fn leading(&self) -> bool {
        matches!(self.reports().last(), Some(Report::Elected(_)))
    }

    fn health(&self) -> etcd_sync::LoopHealth {
        assert!(eventually(Duration::from_secs(5), || self
            .health
            .lock()
            .unwrap()
            .is_some()));
        self.health.lock().unwrap().clone().unwrap()
    }

    /// Cancels and joins; returns the reports and writes.
    fn stop(self) -> (Vec<Report>, Vec<(i64, i64)>) {
        self.cancel.cancel();
        let started = Instant::now();
        let result = self.thread.join().expect("the loop thread panicked");
        assert!(result.is_ok(), "run ended with {result:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "run took {:?} to return after cancel",
            started.elapsed()
        );
        let reports = self.reports.lock().unwrap().clone();
        let writes = self.writes.lock().unwrap().clone();
        (reports, writes)
    }
}

/// Elected and Ended alternate, starting with Elected; returns the terms' tokens.
fn alternating(reports: &[Report]) -> Vec<i64> {
    let mut tokens = Vec::new();
    for (i, r) in reports.iter().enumerate() {
        match (i % 2, r) {
            (0, Report::Elected(t)) => tokens.push(*t),
            (1, Report::Ended(_)) => {}
            _ => panic!("callbacks out of order: {reports:?}"),
        }
    }
    tokens
}

/// Never two leaders: the guarded writes of all terms, by revision, have non-decreasing
/// fencing tokens.
fn one_leader_at_a_time(mut writes: Vec<(i64, i64)>) {
    writes.sort();
    for pair in writes.windows(2) {
        assert!(
            pair[0].1 <= pair[1].1,
            "a write of term {} at revision {} came after term {} wrote at revision {}",
            pair[1].1,
            pair[1].0,
            pair[0].1,
            pair[0].0
        );
    }
}

#[test]
fn terms_across_a_revoked_lease_have_one_leader_and_callbacks_in_order() {
    let server = common::etcd();
    let endpoints = server.endpoints();
    let a = candidate(client(&endpoints), "ll-revoke", "a", false);
    assert!(eventually(Duration::from_secs(5), || a.leading()));
    let b = candidate(client(&endpoints), "ll-revoke", "b", false);
    let c = client(&endpoints);
    assert!(eventually(Duration::from_secs(5), || keys(
        &c,
        "ll-revoke/"
    )
    .len()
        == 2));

    // Revoke the leader's lease twice over (a, then whoever leads next).
    for round in 0..2 {
        let leader = c.get_prefix("ll-revoke/").unwrap();
        let leader = leader.iter().min_by_key(|kv| kv.create_revision).unwrap();
        let status = etcdctl_command(
            &endpoints[0],
            &["lease", "revoke", &format!("{:x}", leader.lease)],
        )
        .status()
        .unwrap();
        assert!(status.success());
        // The other candidate takes over, and the revoked one campaigns again on a new
        // session: two candidates again.
        assert!(
            eventually(Duration::from_secs(10), || a.elected() + b.elected()
                == round + 2
                && keys(&c, "ll-revoke/").len() == 2),
            "round {round}: a {:?}, b {:?}, keys {:?}",
            a.reports(),
            b.reports(),
            keys(&c, "ll-revoke/")
        );
    }
    // Each loop saw both leaders come in (its own terms and the other's).
    for (who, seen) in [
        ("a", a.changes.lock().unwrap().clone()),
        ("b", b.changes.lock().unwrap().clone()),
    ] {
        assert!(
            seen.iter().any(|v| v == "a") && seen.iter().any(|v| v == "b"),
            "{who} observed {seen:?}"
        );
    }
    let (ra, wa) = a.stop();
    let (rb, wb) = b.stop();
    let ended: Vec<String> = ra
        .iter()
        .chain(&rb)
        .filter_map(|r| match r {
            Report::Ended(why) => Some(why.clone()),
            Report::Elected(_) => None,
        })
        .collect();
    // The key's deletion or the session's loss, whichever the loop saw first.
    assert!(
        ended.iter().filter(|e| e.starts_with("Lost(")).count() >= 2,
        "terms ended by the revocations: {ended:?}"
    );
    let tokens: Vec<i64> = alternating(&ra)
        .into_iter()
        .chain(alternating(&rb))
        .collect();
    assert!(tokens.len() >= 3, "{tokens:?}");
    assert!(wa.len() + wb.len() > 10, "the leaders wrote too little");
    one_leader_at_a_time(wa.into_iter().chain(wb).collect());
    // Cancelled loops leave nothing: resigned, and their own sessions closed.
    assert!(eventually(Duration::from_secs(5), || keys(
        &c,
        "ll-revoke/"
    )
    .is_empty()));
}

#[test]
fn a_killed_member_keeps_one_leader_and_the_loop_leads_again() {
    let cl = cluster();
    let endpoints = cl.endpoints();
    // a talks to member 0 first, b to member 2 first; the checks use member 1.
    let order = |first: usize| {
        let mut v = vec![endpoints[first].clone()];
        v.extend(
            endpoints
                .iter()
                .filter(|e| **e != endpoints[first])
                .cloned(),
        );
        v
    };
    let a = candidate(
        try_client_for(&order(0), Duration::from_secs(1)).unwrap(),
        "ll-kill",
        "a",
        false,
    );
    assert!(eventually(Duration::from_secs(10), || a.leading()));
    let b = candidate(
        try_client_for(&order(2), Duration::from_secs(1)).unwrap(),
        "ll-kill",
        "b",
        false,
    );
    let c = client(&endpoints[1..2]);
    assert!(eventually(Duration::from_secs(10), || keys(&c, "ll-kill/")
        .len()
        == 2));
    let before = a.writes.lock().unwrap().len() + b.writes.lock().unwrap().len();
    cl.kill(0).unwrap();
    // Someone leads and writes again within a few seconds of the kill.
    assert!(
        eventually(Duration::from_secs(15), || a.writes.lock().unwrap().len()
            + b.writes.lock().unwrap().len()
            > before + 20),
        "no leader wrote after the member was killed: a {:?}, b {:?}",
        a.reports(),
        b.reports()
    );
    let (ra, wa) = a.stop();
    let (rb, wb) = b.stop();
    alternating(&ra);
    alternating(&rb);
    one_leader_at_a_time(wa.into_iter().chain(wb).collect());
}

#[test]
fn cancel_while_leading_resigns_and_while_campaigning_leaves_no_key() {
    let server = common::etcd();
    let endpoints = server.endpoints();
    let c = client(&endpoints);
    let a = candidate(client(&endpoints), "ll-cancel", "a", false);
    assert!(eventually(Duration::from_secs(5), || a.leading()));
    let b = candidate(client(&endpoints), "ll-cancel", "b", false);
    assert!(eventually(Duration::from_secs(5), || keys(
        &c,
        "ll-cancel/"
    )
    .len()
        == 2));
    assert_eq!(b.health().state(), LoopState::Campaigning);

    // b is in line: cancelling it removes its key and a still leads.
    let (rb, _) = b.stop();
    assert!(rb.is_empty(), "b never led: {rb:?}");
    assert_eq!(keys(&c, "ll-cancel/").len(), 1);
    assert!(a.leading());
    // a leads: cancelling it resigns (the key goes at once, not with the lease).
    let (ra, _) = a.stop();
    assert_eq!(keys(&c, "ll-cancel/"), Vec::<String>::new());
    assert!(
        matches!(ra.last(), Some(Report::Ended(why)) if why == &format!("{:?}", TermEnd::Cancelled)),
        "{ra:?}"
    );
}

#[test]
fn a_panicking_closure_resigns_and_the_loop_campaigns_again() {
    let server = common::etcd();
    let endpoints = server.endpoints();
    let c = client(&endpoints);
    let holder = session(&c, 30);
    // Someone else leads first, so that a queues, then leads and panics.
    let mut first = holder.election("ll-panic").unwrap().campaign("x").unwrap();
    let a = candidate(client(&endpoints), "ll-panic", "a", true);
    assert!(eventually(Duration::from_secs(5), || keys(&c, "ll-panic/")
        .len()
        == 2));
    let b = candidate(client(&endpoints), "ll-panic", "b", false);
    assert!(eventually(Duration::from_secs(5), || keys(&c, "ll-panic/")
        .len()
        == 3));
    first.resign().unwrap();
    // a leads and panics: it resigns at once (b leads well before a's 3 s TTL) and
    // queues again.
    let started = Instant::now();
    assert!(
        eventually(Duration::from_secs(5), || b.leading()),
        "a: {:?}, b: {:?}",
        a.reports(),
        b.reports()
    );
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
    assert!(eventually(Duration::from_secs(5), || keys(&c, "ll-panic/")
        .len()
        == 2));
    let (ra, _) = a.stop();
    b.stop();
    assert!(
        matches!(ra.get(1), Some(Report::Ended(why)) if why.contains("Panicked(\"boom in the first term\")")),
        "{ra:?}"
    );
}

#[test]
fn health_reports_a_phantom_leader_and_a_loop_that_cannot_reach_etcd() {
    let server = common::etcd();
    let endpoints = server.endpoints();
    let c = client(&endpoints);
    // A closure that ignores lost() for 3 s after being elected: a phantom once revoked.
    let s = session(&c, 30);
    let cancel = CancelToken::new();
    let (cancel2, lease) = (cancel.clone(), s.lease_id());
    let ep = endpoints[0].clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let runner = thread::spawn(move || {
        let election = s.election("ll-health")?;
        let loop_ = election
            .leader_loop("p")
            .wedged_after(Duration::from_millis(500));
        let _ = tx.send(loop_.health());
        loop_.run(&cancel2, |leadership, _| {
            let _ = etcdctl_command(&ep, &["lease", "revoke", &format!("{lease:x}")]).status();
            let _ = leadership.lost().recv_timeout(Duration::from_secs(5));
            // Ignores the loss for 2 s.
            thread::sleep(Duration::from_secs(2));
        })
    });
    let health = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(eventually(Duration::from_secs(5), || health.state()
        == LoopState::Leading));
    assert!(
        eventually(Duration::from_secs(3), || health.is_wedged()),
        "a closure running 1.5 s after the loss is not reported: {health:?}"
    );
    assert!(eventually(Duration::from_secs(5), || !health.is_wedged()
        && health.state() != LoopState::Leading));
    cancel.cancel();
    assert!(runner.join().unwrap().is_ok());
    assert_eq!(health.state(), LoopState::Stopped);
    assert!(!health.is_wedged());

    // etcd gone: the loop keeps failing to start a session and reports it.
    let a = candidate(client(&endpoints), "ll-health2", "a", false);
    assert!(eventually(Duration::from_secs(5), || a.leading()));
    let health = a.health();
    drop(server);
    assert!(
        eventually(Duration::from_secs(15), || health.is_wedged()),
        "{health:?}"
    );
    a.cancel.cancel();
    let result = a.thread.join().unwrap();
    assert!(result.is_ok(), "{result:?}");
}
