//! Unit tests of a wait's limit and token (issue 52: survivors of the mutation sample,
//! RELIABILITY.md "Mutation score").

use super::*;

#[test]
fn a_wait_hands_on_the_callers_own_cancel_token() {
    let token = CancelToken::new();
    let wait = Wait::from_options(WaitOptions::new().cancel_token(&token));
    let given = wait.cancel_token().expect("the caller's token");
    assert!(!given.is_cancelled());
    token.cancel();
    assert!(given.is_cancelled(), "a token of its own, not the caller's");
    assert!(Wait::forever().cancel_token().is_none());
    assert!(Wait::forever().with_cancel(token).cancel_token().is_some());
}

#[test]
fn only_a_limit_shorter_than_one_try_tries_once() {
    assert!(Wait::from_timeout(Duration::ZERO).tries_once());
    assert!(Wait::from_timeout(Duration::from_micros(1)).tries_once());
    assert!(!Wait::from_timeout(Duration::from_secs(3600)).tries_once());
    assert!(!Wait::forever().tries_once());
    assert!(!Wait::never().tries_once());
}

#[test]
fn a_first_attempt_stretches_only_a_limit_too_short_to_try() {
    let request = Duration::from_secs(5);
    // Zero left: the attempt gets the request's time, and keeps the caller's timeout for
    // the error.
    let stretched = Wait::from_timeout(Duration::ZERO).first_attempt(request);
    match stretched.limit {
        Limit::Until(deadline, after) => {
            let left = deadline.saturating_duration_since(crate::support::clock::now());
            assert!(left > Duration::from_secs(4), "{left:?}");
            assert_eq!(after, Duration::ZERO);
        }
        other => panic!("{other:?}"),
    }
    assert!(!stretched.tries_once());
    // An hour left: kept as it is, not cut to the request's time.
    let long = Wait::from_timeout(Duration::from_secs(3600));
    match (long.limit, long.first_attempt(request).limit) {
        (Limit::Until(before, _), Limit::Until(after, _)) => assert_eq!(before, after),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        Wait::forever().first_attempt(request).limit,
        Limit::Forever
    ));
    assert!(Wait::never().first_attempt(request).is_never());
}

#[test]
fn a_failed_join_settles_within_a_quarter_request_timeout_and_the_joins_own() {
    let request = Duration::from_secs(4);
    let now = tokio::time::Instant::now();
    // Just started: a quarter of a request timeout from now.
    let by = acquire::settle_by(now, request);
    let quarter = by.saturating_duration_since(now);
    assert!(
        quarter >= Duration::from_secs(1) && quarter < Duration::from_millis(1100),
        "{quarter:?}"
    );
    // Started 3.5 s ago: never past one request timeout from the start.
    let started = now.checked_sub(Duration::from_millis(3500)).unwrap_or(now);
    let by = acquire::settle_by(started, request);
    assert_eq!(by, started + request);
}
