//! A downgradable write lock held like any other, then half the time downgraded to a read
//! with no gap (`RwLockWriteGuard::downgrade`), in the runs with downgrades
//! ([`RunConfig::downgrades`](super::RunConfig::downgrades)). The read it returns is checked
//! as a fresh acquisition (rule 4: its key is there with the write's token and admitted,
//! and no writer holds beside it), and the history has the downgrade for the outside judge
//! (`tests/fenced/`), which refuses one whose write had already ended (an operator delete,
//! the lease's end: issue 48, item 2). A downgrade that fails ends the write lock: its keys
//! go in the background, a removal the history has as never answered.

use super::history::What;
use super::kinds::{Kind, kind};
use super::{Rng, World};
use crate::recipes::guard::{Guard, WriteKind};
use crate::session::Session;

/// Holds a write guard from `write_downgradable` a while, then releases it or downgrades
/// it and holds the read.
pub(super) fn hold(
    world: &World,
    (me, p): (&str, usize),
    (guard, session, called): (Guard<WriteKind>, &Session, u64),
    rng: &mut Rng,
) {
    let what = Kind::Write;
    super::holding::watch(
        world,
        (me, p),
        (what, &guard, session, called),
        rng,
        (true, |_| {}),
    );
    // Half the writes end with a release; the others go on as reads, even those whose
    // guard says it ended (the downgrade must then fail).
    if rng.below(2) == 0 {
        return super::holding::release(world, me, what, guard);
    }
    let token = super::judge::created(&guard);
    // A quarter of them race an operator who forces the write's release (deletes its
    // writer key alone), up to 100 ms before: the downgrade must fail (issue 48, item 2).
    let forced = guard.is_held() && rng.below(4) == 0;
    if forced {
        super::kinds::delete_key(world, &guard.key_str());
        world.record_now("operator", Some(what.name()), What::Remove { token });
        world.deleted();
        super::sleep(rng.millis(0, 100));
    }
    let was_held = guard.is_held();
    let called = world.tick();
    match guard.downgrade() {
        Ok(read) => {
            world.note(me, format!("downgraded, token {token}"));
            world.record(
                me,
                Some(what.name()),
                What::Downgrade { token },
                (called, true),
            );
            if !was_held || forced {
                world.violation(
                    me,
                    format!(
                        "downgraded a write lock (token {token}) that had said it ended or \
                         whose writer key an operator had deleted"
                    ),
                );
            }
            super::holding::hold(world, (me, p), (Kind::Read, read, session, called), rng);
        }
        Err(e) => {
            world.note(me, format!("downgrade: {}", kind(e.error())));
            if e.into_guard().is_some() {
                world.violation(me, "a downgradable write refused to downgrade".into());
            }
            // The write is over; its keys go in the background (if they are not gone).
            world.record(
                me,
                Some(what.name()),
                What::Remove { token },
                (called, false),
            );
        }
    }
}
