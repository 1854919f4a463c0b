//! Waiting one's turn in the line: at the back of a long line on one lookout key
//! (`line/behind/`), then at the front on the name's shared watcher, where the last key
//! ahead crossed off is the proof of ownership (`line/crossing.rs`), with no read.

use std::time::Instant;

use crate::client::lease::LeaseState;
use crate::line::behind::{self, UNSYNCED_POLL, Woken, still_there};
use crate::line::crossing::{Awaited, Crossed, Departures};
use crate::line::queue::{
    Ahead, Ours, Position, key_gone_error, read_position_at, warn_of_foreign_keys,
};
use crate::support::error::{Error, Result};
use crate::support::kv::text;
use crate::transport::Rpc;
use crate::transport::watch::Only;
use crate::transport::watches::waiting::{Waiting, Wake};
use crate::transport::watches::{Pin, Spec, UNSYNCED_WINDOW, Watches};

/// Our turn came: the revision that proves it, and, when the name's shared watcher told
/// us, a pin that keeps that watcher running until the guard's follow has subscribed to it.
/// Without the pin, a waiter that came from the back (its line unpinned) cancelled the
/// watcher with its subscription, and the follow created it again a moment later: two
/// watch requests per handoff, and a read of the key whenever a write came in between
/// (0.36 reads per acquisition at 256 processes, measured).
pub(crate) struct Granted {
    /// The proof revision: our key exists there, and nothing ahead of it does.
    pub(crate) at: i64,
    /// Dropped once the guard's follow subscribed (`client/follow.rs`).
    pub(crate) keep: Option<Pin>,
    /// The leader's key handed over to us, which we hold instead of our own
    /// (`ownership/handover.rs`); `None`: our own key.
    pub(crate) handed: Option<crate::line::handed::Handed>,
}

impl Granted {
    /// Proved by a read at `at` (no watcher to keep).
    pub(crate) fn read_at(at: i64) -> Granted {
        Granted {
            at,
            keep: None,
            handed: None,
        }
    }
}

/// Blocks (asynchronously) until no key ahead keeps ours from holding (for an exclusive
/// key: until it is the oldest under `prefix`), and returns the revision that proves it.
///
/// The proof (docs/design/handoff.md): `ahead` is exact at revision
/// `seen_at`, and no key can join it later. One watcher of deletes under the prefix —
/// shared by every waiter of this name on the client — reports, in revision order, every
/// delete after `seen_at`, including one of our own key. So when the last key ahead is
/// reported deleted at revision R, with no delete of ours before it, we own at R: no read.
/// A read is needed only when the watcher cannot cover everything after what we know (it
/// had to start after `seen_at`), or when a very long line was tracked only in part.
///
/// Errors: `SessionLost` as soon as the session is lost, `LockLost` if our key is deleted
/// by someone else, or an etcd error that retrying cannot fix. The caller removes the key.
pub(crate) async fn wait_turn(
    rpc: &Rpc,
    watches: &Watches,
    session: &LeaseState,
    ours: Ours<'_>,
    (position, seen_at): (Position, i64),
    departures: Option<&Departures>,
) -> Result<Granted> {
    let key = ours.key;
    let (mut position, mut seen_at) = (position, seen_at);
    loop {
        let mut ahead = match position {
            // The revision of the read that showed us first: the key exists there.
            Position::Owner => return Ok(Granted::read_at(seen_at)),
            Position::Gone => return Err(key_gone_error(rpc, session).await),
            Position::Refused(why) => return Err(Error::InvalidArgument(why)),
            Position::Behind(ahead) => ahead,
        };
        let lookout = ahead.lookout.take();
        if let Some(lookout) = lookout.filter(|_| !front_is_watched(watches, ours)) {
            // Far from our turn: watch the lookout only. When it goes, wait at the front
            // with what we know (exact at `seen_at`): the front's watcher starts later, so
            // its one read tells where we stand now.
            tracing::debug!(key = %text(key), lookouts = lookout.keys.len(), away = lookout.away, "waiting at the back");
            let woken =
                behind::wait_for_lookout(rpc, watches, session, (key, ours.rev), &lookout, seen_at);
            if woken.await? == Woken::OwnDeleted {
                return Err(key_gone_error(rpc, session).await);
            }
        }
        match wait_at_front(rpc, watches, session, ours, (ahead, seen_at), departures).await? {
            Front::Owner(granted) => return Ok(granted),
            Front::Far(ahead, at) => (position, seen_at) = (Position::Behind(ahead), at),
        }
    }
}

/// Whether a wait at `position` starts at the back of the line (`line/behind/`): far
/// from its turn, on a client where no other waiter of the name waits at the front (if one
/// does, the client hears of every release anyway, and one more subscriber costs nothing).
pub(crate) fn starts_far(watches: &Watches, ours: Ours<'_>, position: &Position) -> bool {
    matches!(position, Position::Behind(ahead) if ahead.lookout.is_some())
        && !front_is_watched(watches, ours)
}

/// Whether a waiter of this name on this client waits at the front: then the client hears
/// of every release of the name anyway, and another waiter of it waits there too.
pub(crate) fn front_is_watched(watches: &Watches, ours: Ours<'_>) -> bool {
    watches.has_waiters_under(ours.prefix)
}

/// How a wait at the front ended.
enum Front {
    /// We own, as of this revision (the watcher pinned, see [`Granted`]).
    Owner(Granted),
    /// A read found us far from our turn again (we came from the back and the line moved
    /// less than the lookout said, or a long line was tracked only in part), and no other
    /// waiter of the client is at the front: wait at the back.
    Far(Ahead, i64),
}

/// Waits on the name's shared prefix watcher until the keys `ahead` (exact at `seen_at`)
/// are gone: the handoff without a read.
async fn wait_at_front(
    rpc: &Rpc,
    watches: &Watches,
    session: &LeaseState,
    ours: Ours<'_>,
    (ahead, seen_at): (Ahead, i64),
    departures: Option<&Departures>,
) -> Result<Front> {
    let key = ours.key;
    tracing::debug!(key = %text(key), ahead = ahead.len(), complete = ahead.complete, "waiting");
    warn_of_foreign_keys(ours.prefix, &ahead);
    let mut last = ahead.last.clone();
    let spec = Spec::prefix(ours.prefix, Only::Deletes);
    // Pinned before `deletes` unsubscribes (the hub takes commands in order).
    let owner = |at| {
        Front::Owner(Granted {
            at,
            keep: Some(watches.pin(spec.clone())),
            handed: None,
        })
    };
    let mut deletes = watches.wait_for(
        spec.clone(),
        seen_at,
        awaited(key, ahead, seen_at, departures),
    );
    let mut known = seen_at;
    // Until then, etcd may have registered a just-created watcher as unsynced: read now and
    // then, so a handoff in that window does not wait for etcd's 100 ms sync loop. Not once
    // the watcher has delivered an event at or after our last read: then it has delivered
    // everything up to there, and what comes later it delivers as it happens.
    let mut poll_until: Option<Instant> = None;

    loop {
        session.check()?;
        let poll = poll_until.filter(|until| {
            crate::support::clock::now() < *until && deletes.seen_through() < known
        });
        let delivery = tokio::select! {
            delivery = deletes.next() => delivery,
            reason = session.wait_lost() => return Err(Error::SessionLost(reason)),
            _ = tokio::time::sleep(UNSYNCED_POLL), if poll.is_some() => {
                // The newest key ahead still there: not our turn yet, and one single-key
                // read said so (a read of our place costs etcd the whole line).
                if let Some((key, created)) = &last
                    && still_there(rpc, session, key, *created).await?
                {
                    continue;
                }
                match reread(rpc, session, (ours, departures), &deletes).await? {
                    Reread::Owner(at) => return Ok(owner(at)),
                    Reread::Far(ahead, at) => return Ok(Front::Far(ahead, at)),
                    Reread::Waiting(at, newest) => (known, last) = (at, newest),
                }
                continue;
            }
        };
        match delivery {
            Wake::From { after, fresh } => {
                // Everything after what we know follows, unless the watcher starts later:
                // then deletes in (known, after] are not on it, and one read covers them.
                // A just-created watcher is read for once too, to see whether a write raced
                // its creation (then it may be unsynced for up to 100 ms).
                if after <= known && !fresh {
                    continue;
                }
                match reread(rpc, session, (ours, departures), &deletes).await? {
                    Reread::Owner(at) => return Ok(owner(at)),
                    Reread::Far(ahead, at) => return Ok(Front::Far(ahead, at)),
                    Reread::Waiting(at, newest) => {
                        (known, last) = (at, newest);
                        if fresh && at > after {
                            poll_until = Some(crate::support::clock::now() + UNSYNCED_WINDOW);
                        }
                    }
                }
            }
            Wake::Verdict(Crossed::Cleared { at, complete: true }) => {
                tracing::debug!(key = %text(key), at, "owner by event order");
                return Ok(owner(at));
            }
            // Only part of a long line was tracked: find the rest.
            Wake::Verdict(Crossed::Cleared { .. }) => {
                match reread(rpc, session, (ours, departures), &deletes).await? {
                    Reread::Owner(at) => return Ok(owner(at)),
                    Reread::Far(ahead, at) => return Ok(Front::Far(ahead, at)),
                    Reread::Waiting(at, newest) => (known, last) = (at, newest),
                }
            }
            Wake::Verdict(Crossed::OwnDeleted) => return Err(key_gone_error(rpc, session).await),
            Wake::Failed(e) => return Err(e),
        }
    }
}

/// What a waiter awaits: the keys `ahead` of `own`, exact at revision `known`.
fn awaited(own: &[u8], ahead: Ahead, known: i64, departures: Option<&Departures>) -> Awaited {
    Awaited {
        departures: departures.cloned(),
        own: own.to_vec(),
        keys: ahead.keys,
        complete: ahead.complete,
        known,
    }
}

/// The outcome of [`reread`].
enum Reread {
    /// We own, as of this revision.
    Owner(i64),
    /// Keys are still ahead, as of this revision (the newest of them, if we wait for every
    /// one); the subscription now awaits them.
    Waiting(i64, Option<(Vec<u8>, i64)>),
    /// Keys are ahead, as of this revision, we are far from our turn, and no other waiter
    /// of the client is at the front: wait at the back.
    Far(Ahead, i64),
}

/// Reads our place in the line again and has `deletes` await the keys now ahead. Retried
/// until etcd answers: a wait outlives a leader election (its members answer "no leader"
/// meanwhile) and a failover; only its bound, a session loss or an error that retrying
/// cannot fix ends it.
async fn reread(
    rpc: &Rpc,
    session: &LeaseState,
    (ours, departures): (Ours<'_>, Option<&Departures>),
    deletes: &Waiting<Awaited>,
) -> Result<Reread> {
    let position = session
        .retry_while_alive(|| read_position_at(rpc, ours))
        .await?;
    if let Some(departures) = departures {
        match &position.0 {
            Position::Owner => departures.all_but([]),
            Position::Behind(ahead) => departures.all_but(ahead.keys()),
            Position::Gone | Position::Refused(_) => {}
        }
    }
    match position {
        (Position::Owner, at) => Ok(Reread::Owner(at)),
        (Position::Gone, _) => Err(key_gone_error(rpc, session).await),
        (Position::Refused(why), _) => Err(Error::InvalidArgument(why)),
        (Position::Behind(ahead), at) if ahead.lookout.is_some() && deletes.is_alone() => {
            Ok(Reread::Far(ahead, at))
        }
        (Position::Behind(ahead), at) => {
            let last = ahead.last.clone();
            deletes.wait_again(at, awaited(ours.key, ahead, at, departures));
            Ok(Reread::Waiting(at, last))
        }
    }
}
