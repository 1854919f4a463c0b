//! A simulated process's leader loop: it campaigns, leads for a while (`term` checks each
//! leadership as any other is checked), resigns and campaigns again, until a task of the
//! simulation cancels it. Its terms run through the loop's own code: backoff after a lost
//! term, sessions of its own once the process's session is lost, the resignation after
//! each term.

use std::time::Duration;

use crate::recipes::election::Leadership;
use crate::session::Session;
use crate::support::cancel::CancelToken;
use crate::support::error::Result;

/// Runs a leader loop for election `name` on `session` for `run_for` of virtual time;
/// returns how many terms it led.
pub(super) fn lead(
    session: &Session,
    name: &str,
    (value, run_for): (&str, Duration),
    mut term: impl FnMut(&Leadership),
) -> Result<u64> {
    let cancel = CancelToken::new();
    let stop = cancel.clone();
    session.client().spawn(async move {
        tokio::time::sleep(run_for).await;
        stop.cancel();
    });
    let mut terms = 0u64;
    session
        .election(name)?
        .leader_loop(value)
        // Short, so a run sees many terms (the pauses take virtual time).
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .run(&cancel, |leadership, _| {
            terms += 1;
            term(leadership);
        })?;
    Ok(terms)
}
