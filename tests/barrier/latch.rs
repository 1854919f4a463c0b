//! CountDownLatch: counting down exactly, one count set by concurrent creators.

use std::time::{Duration, Instant};

use super::common::{client, etcd};
use super::{returned, spawn, still_blocked};
use etcd_sync::{CancelToken, Error, Operation};

#[test]
fn latch_counts_down_exactly_and_opens_its_waiters() {
    let server = etcd();
    let c = client(&server.endpoints());
    let latch = c.count_down_latch("loaded").unwrap();
    assert!(latch.try_wait().unwrap(), "a latch never set is open");
    assert_eq!(latch.count_down().unwrap(), 0, "nothing to count down");
    assert!(latch.try_set_count(3).unwrap());
    assert!(!latch.try_set_count(9).unwrap(), "set once");
    assert_eq!(latch.count().unwrap(), 3);
    let other = client(&server.endpoints());
    let waiter = {
        let l = other.count_down_latch("loaded").unwrap();
        spawn(move || l.wait())
    };
    assert_eq!(latch.count_down().unwrap(), 2);
    assert_eq!(latch.count_down().unwrap(), 1);
    still_blocked(&waiter, Duration::from_millis(300), "a wait at count 1");
    let e = latch.wait_timeout(Duration::from_millis(200)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Timeout {
                operation: Operation::Latch,
                ..
            }
        ),
        "{e:?}"
    );
    let opened_at = Instant::now();
    assert_eq!(latch.count_down().unwrap(), 0);
    let (result, at) = returned(&waiter, "a wait after the last count-down");
    result.unwrap();
    assert!(at.duration_since(opened_at) < Duration::from_secs(2));
    assert!(
        c.get("loaded").unwrap().is_none(),
        "an open latch leaves no key"
    );
    assert_eq!(latch.count().unwrap(), 0);
    latch.wait_with(&CancelToken::new()).unwrap();

    // Concurrent count-downs from several clients never merge: exactly 40 take it to 0.
    assert!(
        latch.try_set_count(40).unwrap(),
        "a new latch once the last one opened"
    );
    let endpoints = server.endpoints();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let endpoints = endpoints.clone();
            spawn(move || {
                let l = client(&endpoints).count_down_latch("loaded").unwrap();
                (0..10)
                    .map(|_| l.count_down().unwrap())
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    let mut left: Vec<u64> = workers
        .iter()
        .flat_map(|w| returned(w, "a worker").0)
        .collect();
    left.sort_unstable();
    assert_eq!(
        left,
        (0..40).collect::<Vec<u64>>(),
        "each count seen exactly once"
    );
    assert!(latch.try_wait().unwrap());
}

#[test]
fn concurrent_creation_of_a_latch_sets_one_count() {
    let server = etcd();
    let endpoints = server.endpoints();
    let setters: Vec<_> = (1..=4u64)
        .map(|n| {
            let endpoints = endpoints.clone();
            spawn(move || {
                let l = client(&endpoints).count_down_latch("race").unwrap();
                (n, l.try_set_count(n * 10).unwrap())
            })
        })
        .collect();
    let results: Vec<(u64, bool)> = setters.iter().map(|s| returned(s, "a setter").0).collect();
    let winners: Vec<u64> = results
        .iter()
        .filter(|(_, won)| *won)
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let c = client(&endpoints);
    assert_eq!(
        c.count_down_latch("race").unwrap().count().unwrap(),
        winners[0] * 10
    );
}
