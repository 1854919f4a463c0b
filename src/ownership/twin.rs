//! A downgradable write (docs/design/downgrade.md): the writer key `W`
//! and its shared twin `R` put by one Txn, so both have one create revision `c`. Keys wait
//! only for keys created before their own, so `W` holds as a writer with `R` beside it,
//! every later key waits for `W` (and, unless it is a reader, for `R`), and deleting `W`
//! leaves `R` holding our place as a reader: the downgrade (`hold/downgrade.rs`).
//!
//! Both lines' local turns are taken, the writer's first (one order for every taker):
//! owning the reader line's local turn, no read hold, waiter or release of this process
//! uses `R`, so a key of our lease there is this attempt's (or a leftover), and the cleanup
//! may remove it by lease. The acquisition yields two holds, each following its own key and
//! releasing it by its revision; their guard's "lost" signal is shared, so the loss of
//! either key ends the write guard.

use std::sync::Arc;

use super::acquire::{hold_from, join_within, may_start, new_hold, take_local_turn, wait_in_line};
use super::{Held, Kind, Place, Wait};
use crate::line::queue::Position;
use crate::support::error::operation::Operation;
use crate::support::error::try_lock::TryLockError;
use crate::support::signal::Signal;

/// Acquires `line` (the writer line) for `kind` with its twin key on `twin` (the reader
/// line of the same session and name): the writer hold and the twin's hold, sharing one
/// "lost" signal. On every error both keys are removed (or their removals are running,
/// local turns in hand).
pub(crate) fn acquire_twin(
    line: &Arc<Place>,
    twin: &Arc<Place>,
    kind: Kind,
    value: &[u8],
    wait: Wait,
) -> std::result::Result<(Held, Held), TryLockError> {
    let started = crate::support::telemetry::Stopwatch::start();
    let session = may_start(line, &wait)?;
    let client = line.session.client().clone();
    let rpc = client.rpc().clone();
    let operation = kind.operation();
    let (enqueued, local_turn, twin_local_turn, granted) = client.block_on(async {
        let local_turn = take_local_turn(line, &session, &wait, operation).await?;
        // Nothing is written before both local turns are ours: an error here leaves no key.
        let twin_local_turn = take_local_turn(twin, &session, &wait, operation).await?;
        let joined = async {
            let (enqueued, local_turn) = join_within(
                &rpc,
                line,
                Some(twin),
                kind,
                value,
                &wait,
                &session,
                local_turn,
            )
            .await?;
            wait_in_line(&rpc, line, kind, &wait, &session, enqueued, local_turn).await
        };
        match joined.await {
            Ok((enqueued, local_turn, granted)) => {
                Ok((enqueued, local_turn, twin_local_turn, granted))
            }
            Err(e) => {
                // The writer key is removed (or its removal runs, its local turn in hand).
                // The twin: any key of our lease on the reader line is this attempt's,
                // since we own that line's local turn; removed by the revision read, and
                // that line is swept for a late copy of the join from then on.
                let removed = super::join::clean_up_ambiguous(twin, twin_local_turn);
                let _ = tokio::time::timeout(rpc.request_timeout() / 4, removed).await;
                Err(e)
            }
        }
    })?;
    // The twin existed since the join (`c`): it is followed from there, so a delete of it
    // at any time before the writer's proof is seen (or read) too.
    let at_once = matches!(enqueued.position, Position::Behind(_));
    let read = Kind::Lock(Operation::Read);
    let thread = std::thread::current().id();
    let twin_hold = new_hold(
        twin,
        (read, &enqueued, None),
        (twin_local_turn, thread),
        (enqueued.rev, at_once),
        None,
    );
    let mut writer = hold_from(
        line,
        kind,
        (enqueued, local_turn, granted),
        (started, thread),
    );
    let mut twin_held = Held::new(twin_hold);
    let shared = Arc::new(Signal::new());
    writer.share_signal(&shared);
    twin_held.share_signal(&shared);
    Ok((writer, twin_held))
}
