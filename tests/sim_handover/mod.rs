//! Leadership hand-over (issue 53) in the simulated cluster: the faults a real etcd cannot
//! place on cue (a member that lags, freezes or swallows its answers) between the
//! request, the answer and the adoption. Part of `tests/simulation.rs`.

use std::time::{Duration, Instant};

use crate::common;

const SECOND: Duration = Duration::from_secs(1);

/// A candidate whose wait ends (its limit) after it answered a hand-over, just after the
/// leader's adoption Txn made the leader's key its own and before it heard so: the wait
/// removes that key too, so the name is not left led by nobody until the candidate's
/// session ends. The candidate's member lags 600 ms: its answer lands 1.2 s after the
/// request, the adoption right after, the news of its key's deletion 600 ms later; its
/// limit falls between. (Mutation testing, shard 3/10: a failed wait that removed only
/// its own key by revision, as a wait that never answered does, left the adopted key.)
#[test]
fn a_candidate_whose_wait_ends_after_its_answer_leaves_no_leadership_behind() {
    use etcd_sync::Client;
    use etcd_sync::testing::sim::SimCluster;

    common::trace_from_env();
    let cluster = SimCluster::start(2).expect("a simulated cluster");
    let endpoints = cluster.endpoints();
    let leader_client = Client::connect([endpoints[0].clone()]).expect("a client");
    let candidate_client = Client::connect([endpoints[1].clone()]).expect("a client");
    let leader_session = leader_client.session().expect("a session");
    let candidate_session = candidate_client.session().expect("a session");
    let leader = leader_session
        .election("ho")
        .expect("an election")
        .campaign("l")
        .expect("the free leadership");
    cluster.set_lag(1, Some(Duration::from_millis(600)));
    let election = candidate_session.election("ho").expect("an election");
    let started = Instant::now();
    let candidate =
        std::thread::spawn(move || election.campaign_timeout("c", Duration::from_millis(4050)));
    assert!(
        keys_reach(&cluster, "ho/", 2, Duration::from_secs(2)),
        "the candidate never joined"
    );
    std::thread::sleep(Duration::from_millis(2500).saturating_sub(started.elapsed()));
    let handed = leader.hand_over_timeout("c", Duration::from_secs(3));
    let campaign = candidate.join().expect("the candidate's thread");
    assert!(
        campaign.as_ref().is_err_and(|e| e.is_timeout()),
        "the candidate's wait: {:?} (the hand-over: {handed:?})",
        campaign.map(|l| l.key().to_vec())
    );
    assert!(handed.is_ok(), "the hand-over: {handed:?}");
    assert!(!leader.is_leader());
    let free = Instant::now() + Duration::from_secs(5);
    while !cluster.keys("ho/").is_empty() && Instant::now() < free {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        cluster.keys("ho/"),
        [],
        "a leadership handed to a wait that ended is left behind"
    );
}

/// A candidate whose watch of hand-over requests was down while the leader asked, with
/// the history compacted past the request meanwhile: when its watch resumes it cannot
/// replay that stretch, reads the request once, answers, and takes the leadership. (The
/// candidate's member is frozen with its connections broken while the leader asks.)
/// (Mutation testing, shard 4/10: with that read skipped, the request went unanswered and
/// the hand-over failed.)
#[test]
fn a_hand_over_asked_while_the_candidates_watch_was_down_and_compacted_goes_through() {
    let cluster = etcd_sync::testing::sim::SimCluster::start(2).expect("a simulated cluster");
    let (_session, leader, candidate) =
        leader_and_candidate(&cluster, (&[0], etcd_sync::DEFAULT_REQUEST_TIMEOUT), 1);
    cluster.set_frozen(1, true);
    cluster.break_connections(1);
    std::thread::scope(|s| {
        let handing = s.spawn(|| leader.hand_over_timeout("c", Duration::from_secs(6)));
        assert!(
            keys_reach(&cluster, "ho.handover/", 1, Duration::from_secs(3)),
            "never asked"
        );
        cluster.compact();
        cluster.set_frozen(1, false);
        let handed = handing.join().expect("the hand-over's thread");
        assert!(handed.is_ok(), "the hand-over: {handed:?}");
    });
    let led = candidate.join().expect("the candidate's thread");
    let led = led.expect("the candidate leads");
    assert!(led.is_leader());
    assert_eq!(
        led.key(),
        leader.key(),
        "the candidate holds the leader's key"
    );
}

/// A candidate that answered a hand-over and then lost its key to an operator's delete
/// before the leader's adoption Txn (which then fails: it requires the candidate's key)
/// reads the name once and finds no key of its own lease first: it does not take the
/// leader's key for a handed one, and its campaign ends with `LockLost` while the leader
/// still leads. The leader's member lags 600 ms, so its adoption comes well after the
/// answer. (Mutation testing, shard 5/10: with the read's filter loosened, the candidate
/// took the first key in line, the leader's, for its own: two leaders.)
#[test]
fn a_candidate_whose_key_is_deleted_after_its_answer_does_not_lead() {
    let cluster = etcd_sync::testing::sim::SimCluster::start(2).expect("a simulated cluster");
    let (session, leader, candidate) =
        leader_and_candidate(&cluster, (&[1], etcd_sync::DEFAULT_REQUEST_TIMEOUT), 0);
    cluster.set_lag(1, Some(Duration::from_millis(600)));
    let candidate_key = candidate_key(&cluster, &session);
    std::thread::scope(|s| {
        let handing = s.spawn(|| leader.hand_over_timeout("c", Duration::from_secs(5)));
        assert!(
            keys_reach(&cluster, "ho.handover/", 1, Duration::from_secs(3)),
            "never asked"
        );
        std::thread::sleep(Duration::from_millis(150)); // answered (its member is quick)
        assert_eq!(cluster.delete_prefix(&candidate_key), 1);
        let handed = handing.join().expect("the hand-over's thread");
        assert!(
            handed.as_ref().is_err_and(|e| e.is_hand_over_failed()),
            "the hand-over: {handed:?}"
        );
    });
    let campaign = candidate.join().expect("the candidate's thread");
    assert!(
        campaign.as_ref().is_err_and(|e| e.is_lost()),
        "the candidate's campaign: {:?}",
        campaign.map(|l| (l.key().to_vec(), l.is_leader()))
    );
    assert!(leader.is_leader(), "the leader still leads");
}

/// A hand-over whose requests etcd does not answer (the leader's member frozen) ends with
/// the request's `Timeout`, as documented ("etcd did not answer"), not with
/// `HandOverFailed` (which says a candidate did not take it in time), within its request
/// timeout; the leader leads on. (Mutation testing, shard 5/10: with every timeout
/// reported as the candidate's, the error said the candidate was slow.)
#[test]
fn a_hand_over_that_etcd_does_not_answer_ends_with_the_requests_timeout() {
    use etcd_sync::testing::sim::SimCluster;
    use etcd_sync::{Client, Error, Operation};

    let cluster = SimCluster::start(2).expect("a simulated cluster");
    let endpoints = cluster.endpoints();
    let leader_client = Client::builder()
        .endpoints([endpoints[1].clone()])
        .request_timeout(Duration::from_secs(1))
        .connect()
        .expect("a client");
    let candidate_client = Client::connect([endpoints[0].clone()]).expect("a client");
    let leader_session = leader_client.session().expect("a session");
    let candidate_session = candidate_client.session().expect("a session");
    let leader = leader_session
        .election("ho")
        .expect("an election")
        .campaign("l")
        .expect("the free leadership");
    let election = candidate_session.election("ho").expect("an election");
    let candidate =
        std::thread::spawn(move || election.campaign_timeout("c", Duration::from_secs(4)));
    assert!(
        keys_reach(&cluster, "ho/", 2, Duration::from_secs(2)),
        "the candidate never joined"
    );
    cluster.set_frozen(1, true);
    let asked = Instant::now();
    let handed = leader.hand_over_timeout("c", Duration::from_secs(10));
    let took = asked.elapsed();
    cluster.set_frozen(1, false);
    let e = handed.expect_err("no hand-over through a frozen member");
    assert!(
        matches!(
            e,
            Error::Timeout {
                operation: Operation::Request,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    assert!(leader.is_leader(), "the leader leads on");
    assert!(cluster.keys("ho.handover/").is_empty(), "a request was put");
    assert!(
        candidate
            .join()
            .expect("the candidate's thread")
            .is_err_and(|e| e.is_timeout())
    );
}

/// Whether `cluster` has `n` keys under `prefix` within `limit` (polled every 5 ms).
fn keys_reach(
    cluster: &etcd_sync::testing::sim::SimCluster,
    prefix: &str,
    n: usize,
    limit: Duration,
) -> bool {
    let until = Instant::now() + limit;
    while cluster.keys(prefix).len() != n && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    cluster.keys(prefix).len() == n
}

/// A leader and a candidate in the name `ho`, the leader on `leader_endpoints` with
/// `request_timeout`, the candidate (waiting up to 20 s) on `candidate_endpoint`, both
/// joined and watching.
fn leader_and_candidate(
    cluster: &etcd_sync::testing::sim::SimCluster,
    (leader_endpoints, request_timeout): (&[usize], Duration),
    candidate_endpoint: usize,
) -> (
    etcd_sync::Session,
    etcd_sync::Leadership,
    std::thread::JoinHandle<etcd_sync::Result<etcd_sync::Leadership>>,
) {
    let endpoints = cluster.endpoints();
    let leader_client = etcd_sync::Client::builder()
        .endpoints(leader_endpoints.iter().map(|&i| endpoints[i].clone()))
        .request_timeout(request_timeout)
        .connect()
        .expect("a client");
    let candidate_client =
        etcd_sync::Client::connect([endpoints[candidate_endpoint].clone()]).expect("a client");
    let leader_session = leader_client.session().expect("a session");
    let candidate_session = candidate_client.session().expect("a session");
    let leader = leader_session
        .election("ho")
        .expect("an election")
        .campaign("l")
        .expect("the free leadership");
    let election = candidate_session.election("ho").expect("an election");
    let candidate =
        std::thread::spawn(move || election.campaign_timeout("c", Duration::from_secs(20)));
    assert!(
        keys_reach(cluster, "ho/", 2, Duration::from_secs(2)),
        "the candidate never joined"
    );
    std::thread::sleep(Duration::from_millis(300)); // its watches are up
    (leader_session, leader, candidate)
}

/// The key under `ho/` that is not the leader's (of `session`): the candidate's.
fn candidate_key(
    cluster: &etcd_sync::testing::sim::SimCluster,
    session: &etcd_sync::Session,
) -> String {
    let leaders = format!("ho/{:x}", session.lease_id());
    cluster
        .keys("ho/")
        .into_iter()
        .map(|(key, _)| key)
        .find(|key| *key != leaders)
        .expect("the candidate's key")
}

/// The candidate's campaign ended leading, on the leader's key.
fn candidate_leads(
    candidate: std::thread::JoinHandle<etcd_sync::Result<etcd_sync::Leadership>>,
    leader: &etcd_sync::Leadership,
) {
    let led = candidate.join().expect("the candidate's thread");
    let led = led.expect("the candidate leads");
    assert!(led.is_leader());
    assert!(!leader.is_leader(), "the old leader still says it leads");
    assert_eq!(
        led.key(),
        leader.key(),
        "the candidate holds the leader's key"
    );
}

/// A hand-over request whose put applied and whose answer was lost (the leader's member
/// swallows it), answered by the candidate before the leader's retry on the other member:
/// the retry finds its own request answered and the hand-over goes through. (Mutation
/// testing, shard 5/10: the retry took its own answered request for another hand-over's
/// and failed, and nothing judged that path.)
#[test]
fn a_hand_over_whose_request_was_answered_before_its_retry_goes_through() {
    let cluster = etcd_sync::testing::sim::SimCluster::start(2).expect("a simulated cluster");
    let (_session, leader, candidate) = leader_and_candidate(&cluster, (&[0, 1], SECOND), 1);
    cluster.set_swallow_writes(0, true);
    let handed = leader.hand_over_timeout("c", Duration::from_secs(10));
    cluster.set_swallow_writes(0, false);
    assert!(handed.is_ok(), "the hand-over: {handed:?}");
    candidate_leads(candidate, &leader);
}

/// As above, with the candidate's member 1.2 s behind, so the leader's retry finds its
/// own request not answered yet: it waits for the answer over it, and the hand-over goes
/// through. (Mutation testing, shard 5/10: a retry that took its own request for
/// another's failed, and nothing judged it.)
#[test]
fn a_hand_over_whose_retry_finds_its_request_unanswered_waits_for_the_answer() {
    let cluster = etcd_sync::testing::sim::SimCluster::start(3).expect("a simulated cluster");
    let (_session, leader, candidate) = leader_and_candidate(&cluster, (&[0, 1], SECOND), 2);
    cluster.set_lag(2, Some(Duration::from_millis(1200)));
    cluster.set_swallow_writes(0, true);
    let asked = Instant::now();
    let handed = leader.hand_over_timeout("c", Duration::from_secs(10));
    let took = asked.elapsed();
    cluster.set_swallow_writes(0, false);
    cluster.set_lag(2, None);
    assert!(handed.is_ok(), "the hand-over: {handed:?}");
    // The retry 1 s after the request, the answer 2.4 s after it.
    assert!(
        took > Duration::from_millis(2200),
        "handed over after {took:?}"
    );
    candidate_leads(candidate, &leader);
}

/// A leader whose watch of its request's answer was down while the candidate answered,
/// with the history compacted past the answer meanwhile: when its watch resumes it reads
/// the request once, finds the answer and adopts. (The leader's member is frozen with its
/// connections broken from the request on; the candidate's lags 600 ms, so its answer
/// comes 1.2 s after the request.) (Mutation testing, shard 5/10: with the answer read
/// and not taken, the leader waited out its limit. Before session 48's fix, 2 runs of 5
/// failed with `Unavailable`: the read after the resumed watch met the cut connection,
/// and one failed read ended the whole wait.)
#[test]
fn a_hand_over_answered_while_the_leaders_watch_was_down_and_compacted_goes_through() {
    let cluster = etcd_sync::testing::sim::SimCluster::start(2).expect("a simulated cluster");
    let (_session, leader, candidate) = leader_and_candidate(&cluster, (&[0], SECOND), 1);
    cluster.set_lag(1, Some(Duration::from_millis(600)));
    std::thread::scope(|s| {
        let handing = s.spawn(|| leader.hand_over_timeout("c", Duration::from_secs(8)));
        assert!(
            keys_reach(&cluster, "ho.handover/", 1, Duration::from_secs(3)),
            "never asked"
        );
        cluster.set_frozen(0, true);
        cluster.break_connections(0);
        std::thread::sleep(Duration::from_millis(1800)); // answered meanwhile
        cluster.compact();
        cluster.set_frozen(0, false);
        let handed = handing.join().expect("the hand-over's thread");
        assert!(handed.is_ok(), "the hand-over: {handed:?}");
    });
    cluster.set_lag(1, None);
    candidate_leads(candidate, &leader);
}

/// An adoption Txn that applied while its answer was lost (the leader's member swallows
/// it), retried on the other member: the retry's compares fail, the read after it finds
/// the leader's key on the candidate's lease, and the hand-over reports success. (The
/// candidate's member lags 600 ms, so the request is answered 1.2 s after it is put, and
/// the swallowing starts in between.) The old guard does not say it leads once the
/// candidate does, though its call still waits. (Mutation testing, shard 5/10: with that
/// read's verdict turned, the hand-over that happened was reported as `NotLeader`; with
/// the adoption not marked on the guard, both guards said they led for a second.)
#[test]
fn an_adoption_whose_answer_was_lost_reads_that_it_applied() {
    let cluster = etcd_sync::testing::sim::SimCluster::start(2).expect("a simulated cluster");
    let (_session, leader, candidate) = leader_and_candidate(&cluster, (&[0, 1], SECOND), 1);
    cluster.set_lag(1, Some(Duration::from_millis(600)));
    std::thread::scope(|s| {
        let handing = s.spawn(|| leader.hand_over_timeout("c", Duration::from_secs(8)));
        assert!(
            keys_reach(&cluster, "ho.handover/", 1, Duration::from_secs(3)),
            "never asked"
        );
        std::thread::sleep(Duration::from_millis(300));
        cluster.set_swallow_writes(0, true);
        // The candidate leads while the leader still waits for its retry's answer: the
        // old guard must not say it leads meanwhile.
        let led = candidate.join().expect("the candidate's thread");
        let old_says_it_leads = leader.is_leader();
        let handed = handing.join().expect("the hand-over's thread");
        cluster.set_swallow_writes(0, false);
        assert!(handed.is_ok(), "the hand-over: {handed:?}");
        let led = led.expect("the candidate leads");
        assert!(led.is_leader());
        assert!(!old_says_it_leads, "two guards said they led");
        assert_eq!(
            led.key(),
            leader.key(),
            "the candidate holds the leader's key"
        );
    });
    cluster.set_lag(1, None);
}

/// An adoption Txn refused because a key it requires went between the answer and the
/// Txn (an operator's delete): the candidate's key (the hand-over fails, the leader leads
/// on), the leader's own (`NotLeader`), or the leader's own, put again on its lease by
/// someone (`NotLeader`: a new key is no longer the one it led with). The leader's
/// member lags 1 s: the request applies at T, the answer right after; the leader's new
/// watcher of the request is confirmed at T + 1 s, its read of the request (the answer)
/// served at T + 2 s, its read of the candidate's key at T + 3 s, its adoption at
/// T + 4 s; the delete comes at T + 3.5 s. The three run at once, each in its own
/// cluster. (Mutation testing, shard 5/10: with the refused Txn's read or the verdict
/// after it loosened, the refusal was reported as a hand-over, or as the wrong failure.)
#[test]
fn an_adoption_refused_because_a_key_went_says_which() {
    std::thread::scope(|s| {
        for gone in ["candidate's", "leader's", "leader's, put again"] {
            s.spawn(move || adoption_refused(gone));
        }
    });
}

/// [`an_adoption_refused_because_a_key_went_says_which`] with the key `gone` deleted.
fn adoption_refused(gone: &str) {
    let cluster = etcd_sync::testing::sim::SimCluster::start(2).expect("a simulated cluster");
    let (session, leader, candidate) =
        leader_and_candidate(&cluster, (&[0], Duration::from_secs(5)), 1);
    let leaders = format!("ho/{:x}", session.lease_id());
    let key = match gone {
        "candidate's" => candidate_key(&cluster, &session),
        _ => leaders.clone(),
    };
    let operator = etcd_sync::Client::connect([cluster.endpoints()[1].clone()]).expect("a client");
    cluster.set_lag(0, Some(SECOND));
    std::thread::scope(|s| {
        let handing = s.spawn(|| leader.hand_over_timeout("c", Duration::from_secs(10)));
        assert!(
            keys_reach(&cluster, "ho.handover/", 1, Duration::from_secs(5)),
            "never asked"
        );
        std::thread::sleep(Duration::from_millis(3500));
        assert_eq!(cluster.delete_prefix(&key), 1);
        if gone == "leader's, put again" {
            operator
                .put_with_lease(&key, "again", session.lease_id())
                .expect("a put");
        }
        let handed = handing.join().expect("the hand-over's thread");
        match gone {
            "candidate's" => assert!(
                handed.as_ref().is_err_and(|e| e.is_hand_over_failed()),
                "the {gone} key gone: {handed:?}"
            ),
            _ => assert!(
                matches!(handed, Err(etcd_sync::Error::NotLeader)),
                "the {gone} key gone: {handed:?}"
            ),
        }
    });
    cluster.set_lag(0, None);
    let leads = gone == "candidate's";
    assert!(
        common::eventually(Duration::from_secs(2), || leader.is_leader() == leads),
        "the leader's guard, the {gone} key gone"
    );
    // With the leader's key gone, the candidate is first in line with its own key;
    // with its own key gone, its campaign has lost it.
    let campaign = candidate.join().expect("the candidate's thread");
    match leads {
        false => assert!(campaign.is_ok_and(|led| led.is_leader()), "{gone}"),
        true => assert!(campaign.is_err_and(|e| e.is_lost()), "{gone}"),
    }
}
