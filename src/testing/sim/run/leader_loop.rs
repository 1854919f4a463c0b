//! A simulated process's leader loop: it campaigns, leads for a while (checked as any
//! leadership is), resigns and campaigns again, until a task of the simulation cancels it.
//! Its terms run through the loop's own code: backoff after a lost term, sessions of its
//! own once the process's session is lost, the resignation after each term.

use std::time::Duration;

use super::process::{Kind, kind, watch};
use super::{Rng, World};
use crate::session::Session;
use crate::support::cancel::CancelToken;
use crate::support::error::Result;

/// Runs a leader loop on `session` for 0.5-4 s of virtual time.
pub(super) fn lead(
    world: &World,
    (me, p): (&str, usize),
    session: &Session,
    rng: &mut Rng,
) -> Result<()> {
    let cancel = CancelToken::new();
    let stop = cancel.clone();
    let after = rng.millis(500, 4000);
    session.client().spawn(async move {
        tokio::time::sleep(after).await;
        stop.cancel();
    });
    world.note(me, "leader loop".into());
    let mut terms = 0u64;
    let result = session
        .election(Kind::Lead.name())?
        .leader_loop(me)
        // Short: the loop's pauses wait on a channel, outside virtual time.
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .run(&cancel, |leadership, _| {
            terms += 1;
            watch(
                world,
                (me, p),
                (Kind::Lead, leadership, session),
                rng,
                false,
            );
        });
    world.note(
        me,
        match &result {
            Ok(()) => format!("leader loop stopped after {terms} term(s)"),
            Err(e) => format!("leader loop: {}", kind(e)),
        },
    );
    result
}
