//! Ending the session under a held guard, as a process that exits or is paused does:
//! closed (the lease revoked) or orphaned (its keep-alive stops and the lease expires on
//! the server a TTL later). Either way the guard must say so at once.

use super::World;
use super::kinds::{kind, present};
use crate::recipes::guard::{Guard, GuardKind};
use crate::session::Session;

/// Orphans the session under a held guard (its keep-alive stops; the lease expires on the
/// server a TTL later, keys and all): the guard says so at once.
pub(super) fn orphan_under<K: GuardKind>(
    world: &World,
    me: &str,
    session: &Session,
    guard: &Guard<K>,
    key: &str,
) {
    session.orphan();
    world.note(me, "orphaned its session".into());
    if guard.is_held() {
        world.violation(
            me,
            format!("{key} still held after its session was orphaned"),
        );
    }
}

/// Closes the session under a held guard: the guard says so at once, and once the close
/// is confirmed (the lease revoked) the key is gone from the store.
pub(super) fn close_under<K: GuardKind>(
    world: &World,
    me: &str,
    session: &Session,
    guard: &Guard<K>,
    (name, key, token): (&str, &str, i64),
) -> bool {
    let closed = session.close();
    world.note(
        me,
        match &closed {
            Ok(()) => "closed its session".into(),
            Err(e) => format!("close: {}", kind(e)),
        },
    );
    if guard.is_held() {
        world.violation(me, format!("{key} still held after its session closed"));
    }
    if closed.is_ok() && present(world, name, key, token) {
        world.violation(
            me,
            format!("{key} still in the store after its session closed"),
        );
    }
    closed.is_ok()
}
