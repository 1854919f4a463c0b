//! A session's **place** in the line of one name: the etcd key `<name>/<lease hex>` it
//! queues with, and the **local turn** in front of it (a process-local gate; the turn in
//! etcd is the line's, [`wait_turn`](crate::line::wait::wait_turn)). Every recipe of that
//! session and name shares one place, so two live guards over one key cannot exist. The
//! line itself (the keys of every session under the name, who is ahead) is `line/`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};

use super::Hold;
use crate::line::mode::Mode;
use crate::line::queue::{self, Ours};
use crate::session::Session;
use crate::support::error::Result;
use crate::transport::watch::Only;
use crate::transport::watches::{Pin, Spec, Watches};

/// One session's place under one name, shared by every recipe of that session and name.
pub(crate) struct Place {
    pub(super) session: Session,
    pub(super) name: Vec<u8>,
    pub(super) prefix: Vec<u8>,
    /// How the key shares the name; it is part of the key (see `line/mode.rs`).
    pub(super) mode: Mode,
    pub(super) key: Vec<u8>,
    /// The local turn: owned by whoever uses the key (waiter, guard, cleanup).
    pub(super) local_turn: Arc<tokio::sync::Mutex<()>>,
    /// The hold that owns the local turn now, if any.
    pub(super) current: StdMutex<Weak<Hold>>,
    /// Keeps the client's watcher of deletes under the name once this line has waited at
    /// the front, so the next wait finds it running, with its history: no create and no
    /// read. Dropped when a wait starts at the back of a long line, so that a client whose
    /// waiters are all far back hears of no release (issue 28).
    pub(super) deletes_pinned: StdMutex<Option<Pin>>,
    /// Keeps the client's watcher of deletes of this line's own key once a wait started at
    /// the back (where a waiter watches its own key beside its lookout), so the next wait
    /// there finds it running: no create and no cancel per turn. The key is the same for
    /// every turn of the session; a release of ours costs it one event.
    pub(super) own_pinned: StdMutex<Option<Pin>>,
    /// etcd refused a release's delete of the key's release request (a role that covers
    /// `<name>/` only): releases delete the key alone from then on (`requests.rs`).
    pub(super) requests_denied: Arc<std::sync::atomic::AtomicBool>,
    /// The last enqueue found more keys under the name than its read of the line returns,
    /// or there was none yet (a resumed lease's leftovers are likeliest then): the next one
    /// reads our lease's keys there in its Txn (`queue::enqueue`'s `apart`).
    pub(super) line_was_long: std::sync::atomic::AtomicBool,
}

/// The lines of every session of this process, by session, name and mode. It lives here, not in
/// the session, so the session module does not depend on the ownership core.
static PLACES: StdMutex<Places> = StdMutex::new(Places {
    slots: BTreeMap::new(),
    prune_at: 0,
});

/// The table of [`PLACES`]. Dead slots are pruned when the table has doubled since the last
/// prune, so creating a line costs O(log n) amortized however many lines the process has.
struct Places {
    slots: BTreeMap<(u64, Vec<u8>, Mode), Slot>,
    prune_at: usize,
}

/// One session's line under one name, and its local turn. The local turn is kept apart from
/// the line: a release or cleanup still running in the background holds the local turn
/// after the last Mutex, Election and guard of the name are gone, and a line created again
/// must queue behind it.
struct Slot {
    line: Weak<Place>,
    local_turn: Weak<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Place")
            .field("key", &crate::support::kv::text(&self.key))
            .finish_non_exhaustive()
    }
}

impl Place {
    /// The session's line under `name` in `mode`, shared by every recipe of that session,
    /// name and mode (so a Mutex, an Election and an RwLock writer of one name on one
    /// session take turns on one key).
    pub(crate) fn of(session: &Session, name: &[u8], mode: Mode) -> Result<Arc<Place>> {
        let id = (session.lease().serial(), name.to_vec(), mode);
        let mut lines = PLACES.lock().unwrap_or_else(|e| e.into_inner());
        let local_turn = match lines.slots.get(&id) {
            Some(slot) => match slot.line.upgrade() {
                Some(line) => return Ok(line),
                None => slot.local_turn.upgrade(),
            },
            None => None,
        };
        let local_turn = local_turn.unwrap_or_default();
        let line = Arc::new(Place::new(session.clone(), name, mode, local_turn.clone())?);
        if lines.slots.len() >= lines.prune_at {
            lines.slots.retain(|_, slot| {
                slot.line.strong_count() > 0 || slot.local_turn.strong_count() > 0
            });
            lines.prune_at = (lines.slots.len() * 2).max(64);
        }
        lines.slots.insert(
            id,
            Slot {
                line: Arc::downgrade(&line),
                local_turn: Arc::downgrade(&local_turn),
            },
        );
        Ok(line)
    }

    fn new(
        session: Session,
        name: &[u8],
        mode: Mode,
        local_turn: Arc<tokio::sync::Mutex<()>>,
    ) -> Result<Place> {
        let prefix = queue::key_prefix(name)?;
        let key = queue::own_key(&prefix, session.lease_id(), mode);
        Ok(Place {
            session,
            name: name.to_vec(),
            prefix,
            mode,
            key,
            local_turn,
            current: StdMutex::new(Weak::new()),
            deletes_pinned: StdMutex::new(None),
            own_pinned: StdMutex::new(None),
            requests_denied: Arc::default(),
            line_was_long: std::sync::atomic::AtomicBool::new(true),
        })
    }

    pub(crate) fn session(&self) -> &Session {
        &self.session
    }

    pub(crate) fn name(&self) -> &[u8] {
        &self.name
    }

    pub(crate) fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }

    /// Our key in the line, created at revision `rev`.
    pub(crate) fn ours(&self, rev: i64) -> Ours<'_> {
        Ours {
            prefix: &self.prefix,
            key: &self.key,
            mode: self.mode,
            rev,
        }
    }

    /// Whether the calling thread owns a live hold on this session's line of this name in
    /// any mode: a wait now could wait on that hold's key (a writer behind this thread's
    /// own read, or the other way round), which would never end.
    pub(crate) fn held_by_this_thread(&self) -> bool {
        let serial = self.session.lease().serial();
        let lines: Vec<Arc<Place>> = {
            let lines = PLACES.lock().unwrap_or_else(|e| e.into_inner());
            lines
                .slots
                .range((serial, self.name.clone(), Mode::Exclusive)..)
                .take_while(|((s, name, _), _)| *s == serial && *name == self.name)
                .filter_map(|(_, slot)| slot.line.upgrade())
                .collect()
        };
        let me = std::thread::current().id();
        lines.iter().any(|line| {
            line.live_hold()
                .is_some_and(|hold| hold.state().thread == me)
        })
    }

    /// The client's watches, for a wait that starts `far` back in the line or at its
    /// front: at the front, the watcher of deletes under the name is pinned for the life of
    /// this line (waiters subscribe to it); far back, it is unpinned, and the watcher of
    /// the line's own key is pinned instead, for the life of the line: one created for it
    /// starts right after `known` (a revision at which the key exists), so that it covers
    /// the whole wait with no read.
    pub(crate) fn watches_for(&self, far: bool, known: i64) -> &Watches {
        let watches = self.session.client().watches();
        let mut pinned = self
            .deletes_pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match (far, pinned.is_some()) {
            (true, true) => *pinned = None,
            (false, false) => {
                *pinned = Some(watches.pin(Spec::prefix(&self.prefix, Only::Deletes)));
            }
            _ => {}
        }
        if far {
            let mut own = self.own_pinned.lock().unwrap_or_else(|e| e.into_inner());
            if own.is_none() {
                *own = Some(watches.pin_from(Spec::key(&self.key, Only::Deletes), Some(known)));
            }
        }
        watches
    }

    /// Whether this line keeps its own key's watcher running (it waited at the back).
    pub(crate) fn watches_own_key(&self) -> bool {
        self.own_pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// The hold that owns this line's local turn, if it has not ended.
    pub(crate) fn live_hold(&self) -> Option<Arc<Hold>> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.upgrade().filter(|hold| !hold.is_ended())
    }
}

/// The table of places (mutation shard 7/10, issue 52).
#[cfg(test)]
#[cfg(feature = "testing")]
mod tests {
    use super::*;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    /// A session on a real etcd of its own (the server goes when the test ends).
    fn with_session(test: impl FnOnce(&Session) -> TestResult) -> TestResult {
        let server = crate::testing::EtcdServer::start()?;
        let session = crate::Client::connect(server.endpoints())?.session()?;
        test(&session)
    }

    /// The table of places forgets the slots of dropped handles: a session that made a
    /// thousand names' places, one after the other, keeps few slots (mutation shard 7/10: with
    /// the prune keeping every slot, all thousand stayed for the life of the process).
    #[test]
    fn places_of_dropped_handles_are_pruned() -> TestResult {
        with_session(|session| {
            let make = |name: String| Place::of(session, name.as_bytes(), Mode::Exclusive);
            for i in 0..1000 {
                drop(make(format!("pruned-{i}"))?);
            }
            let left = {
                let serial = session.lease().serial();
                let table = PLACES.lock().unwrap_or_else(|e| e.into_inner());
                table.slots.keys().filter(|(s, _, _)| *s == serial).count()
            };
            assert!(left < 500, "{left} slots of 1000 dropped places are kept");
            // A live place keeps its slot: the same handle comes back.
            let kept = make("kept".into())?;
            for i in 0..1000 {
                drop(make(format!("more-{i}"))?);
            }
            assert!(Arc::ptr_eq(&kept, &make("kept".into())?));
            Ok(())
        })
    }

    /// A place shows its key in `Debug` (mutation shard 7/10).
    #[test]
    fn a_place_debugs_as_its_key() -> TestResult {
        with_session(|session| {
            let shown = format!("{:?}", Place::of(session, b"shown", Mode::Exclusive)?);
            let key = format!("shown/{:x}", session.lease_id());
            assert!(
                shown.starts_with("Place") && shown.contains(&key),
                "{shown}"
            );
            Ok(())
        })
    }
}
