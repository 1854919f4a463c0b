//! Members that cannot serve: a learner (non-voting member) in the cluster, and a member
//! that lost its raft leader.
//!
//! A learner answers `Status` and serializable reads and refuses everything else with
//! "rpc not supported for learner", before handling it. The client must never settle on
//! one: not at connect when it is the first endpoint, and not after a failover lands on
//! it; and because the refusal comes before handling, even a write that is never retried
//! after an ambiguous failure (a plain put) goes on to the next member.
//!
//! A member without a leader refuses calls that carry `hasleader` at once; without it a
//! unary call would wait for a leader until our request timeout.

#![cfg(feature = "testing")]

mod common;

use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use etcd_sync::Client;
use etcd_sync::testing::EtcdCluster;

/// Tests here start 4-member clusters and kill members: one at a time on 2 CPUs.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: StdMutex<()> = StdMutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Three voters (0, 1, 2) and one learner (3).
fn cluster_with_learner() -> EtcdCluster {
    let cluster = match EtcdCluster::builder(3).learners(1).start() {
        Ok(cluster) => cluster,
        Err(e) => panic!("cannot start an etcd cluster with a learner: {e}"),
    };
    assert!(cluster.is_learner(3) && !cluster.is_learner(0));
    cluster
}

fn client_for(endpoints: &[String]) -> etcd_sync::Result<Client> {
    Client::builder()
        .endpoints(endpoints)
        .request_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(2))
        .connect()
}

/// The learner answers what it may: a serializable read through it sees the voters' data
/// (proof that it is a live, replicating member, so the tests below mean something).
fn assert_learner_replicates(cluster: &EtcdCluster, key: &str, value: &str) {
    let learner = cluster.member_endpoint(3);
    let seen = common::eventually(Duration::from_secs(5), || {
        let output = common::etcdctl_command(
            &learner,
            &["get", "--consistency=s", "--print-value-only", key],
        )
        .output()
        .expect("run etcdctl");
        String::from_utf8_lossy(&output.stdout).trim() == value
    });
    assert!(seen, "the learner never served {key}={value}");
    let refused = common::etcdctl_command(&learner, &["put", "learner/direct", "x"])
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run etcdctl");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not supported for learner"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

#[test]
fn a_learner_as_first_endpoint_is_passed_over() {
    let _serial = serial();
    let cluster = cluster_with_learner();
    let all = cluster.endpoints();
    let learner_first = vec![
        all[3].clone(),
        all[0].clone(),
        all[1].clone(),
        all[2].clone(),
    ];
    let started = Instant::now();
    let client = client_for(&learner_first).expect("connect with a learner first");
    // The first call is a plain put, never retried after an ambiguous failure: it must
    // still reach a voter.
    client.put("learner/plain", "v1").expect("plain put");
    assert_learner_replicates(&cluster, "learner/plain", "v1");

    // Sessions (keep-alive stream), locks (txn, watch stream), elections, all through a
    // client whose first endpoint is the learner.
    let holder = common::session(&client, 10);
    let guard = holder.mutex("learner/lock").unwrap().lock().expect("lock");
    assert!(guard.is_held());
    guard.put("learner/data", "mine").expect("guarded put");

    let other = client_for(&learner_first).expect("second client");
    let waiter_session = common::session(&other, 10);
    let waiter_mutex = waiter_session.mutex("learner/lock").unwrap();
    let waiter = std::thread::spawn(move || waiter_mutex.lock().map(|g| g.fencing_token()));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished(), "acquired while the lock was held");
    let token = guard.fencing_token();
    drop(guard);
    let next = waiter.join().unwrap().expect("the waiter acquires");
    assert!(next > token);

    let election = holder.election("learner/election").unwrap();
    let leadership = election.campaign("me").expect("campaign");
    assert!(leadership.is_leader());
    assert_eq!(
        election.leader().expect("leader").map(|l| l.value),
        Some(b"me".to_vec())
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "learner made the calls slow: {:?}",
        started.elapsed()
    );
}

#[test]
fn only_a_learner_to_connect_to_is_an_error_that_says_so() {
    let _serial = serial();
    let cluster = cluster_with_learner();
    let started = Instant::now();
    let error = match client_for(&[cluster.member_endpoint(3)]) {
        Ok(_) => panic!("connected to a learner alone"),
        Err(e) => e,
    };
    assert!(error.is_connect(), "{error:?}");
    assert!(error.to_string().contains("learner"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_failover_that_lands_on_the_learner_goes_on_to_a_voter() {
    let _serial = serial();
    let cluster = cluster_with_learner();
    let all = cluster.endpoints();
    // The client starts on a follower (killing the raft leader would add an election,
    // whose timeouts are ambiguous too; tests/faults.rs covers that), and after it the
    // next endpoint in line is the learner.
    let leader = cluster.leader().expect("raft leader");
    let doomed = (0..3).find(|&i| i != leader).unwrap();
    let others: Vec<usize> = (0..3).filter(|&i| i != doomed).collect();
    let endpoints = vec![
        all[doomed].clone(),
        all[3].clone(),
        all[others[0]].clone(),
        all[others[1]].clone(),
    ];
    let client = client_for(&endpoints).expect("connect");
    let session = common::session(&client, 4);
    let guard = session
        .mutex("learner/failover")
        .unwrap()
        .lock()
        .expect("lock");
    let token = guard.fencing_token();

    cluster.kill(doomed).expect("kill the client's member");
    // Writes that must not be sent twice: the first may meet the dead member (an
    // ambiguous failure, returned as is); after that the client is on the learner, which
    // refuses before handling, so the write goes on to a voter.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut failures = Vec::new();
    let written = loop {
        match client.put("learner/after-kill", "v") {
            Ok(revision) => break revision,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                failures.push(e.to_string());
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("plain put after the kill: {e:?}"),
        }
    };
    assert!(written > 0);
    // Only the dead member's failure may be ambiguous (once); "no leader" answers while
    // the voters elect a new leader are refusals, and the learner's never surfaces.
    let ambiguous = failures.iter().filter(|f| !f.contains("no leader")).count();
    assert!(
        ambiguous <= 1,
        "failures before a voter answered: {failures:?}"
    );
    assert!(
        failures.iter().all(|f| !f.contains("learner")),
        "the learner's refusal surfaced: {failures:?}"
    );

    // Longer than the TTL: the keep-alive went from the dead member past the learner to a
    // voter, so the lease, the key and the guard stay.
    std::thread::sleep(Duration::from_secs(5));
    assert!(session.is_alive(), "lost: {:?}", session.loss_reason());
    assert!(guard.is_held());
    guard
        .put("learner/guarded", "still mine")
        .expect("guarded put");

    let survivors = [all[others[0]].clone(), all[others[1]].clone()];
    let waiter_client = client_for(&survivors).expect("waiter client");
    let waiter_session = common::session(&waiter_client, 5);
    let waiter_mutex = waiter_session.mutex("learner/failover").unwrap();
    let waiter = std::thread::spawn(move || waiter_mutex.lock().map(|g| g.fencing_token()));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished(), "acquired while the lock was held");
    drop(guard);
    let next = waiter.join().unwrap().expect("the waiter acquires");
    assert!(next > token);
}

#[test]
fn a_member_without_a_leader_refuses_at_once_instead_of_timing_out() {
    let _serial = serial();
    let cluster = common::cluster();
    let survivor = cluster.member_endpoint(2);
    let client = Client::builder()
        .endpoints([survivor])
        .request_timeout(Duration::from_secs(8))
        .connect()
        .expect("connect");
    client
        .put("leaderless/before", "v")
        .expect("put with a quorum");
    cluster.kill(0).unwrap();
    cluster.kill(1).unwrap();
    let lost_leader = common::eventually(Duration::from_secs(10), || {
        cluster
            .metrics(2)
            .is_ok_and(|text| text.contains("etcd_server_has_leader 0"))
    });
    assert!(lost_leader, "member 2 still reports a leader");
    let started = Instant::now();
    let error = client
        .get("leaderless/before")
        .expect_err("a read without a quorum");
    let took = started.elapsed();
    assert!(error.is_retryable(), "{error:?}");
    assert!(error.to_string().contains("no leader"), "{error}");
    assert!(
        took < Duration::from_secs(2),
        "took {took:?} (request timeout 8 s)"
    );
    let error = client
        .put("leaderless/after", "v")
        .expect_err("a write without a quorum");
    assert!(error.to_string().contains("no leader"), "{error}");
}

#[test]
fn more_learners_than_etcd_allows_are_refused_before_starting() {
    let started = Instant::now();
    let err = EtcdCluster::builder(3)
        .learners(2)
        .start()
        .expect_err("two learners must be refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("one learner"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(1));
}
