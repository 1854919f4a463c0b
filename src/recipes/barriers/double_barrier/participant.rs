//! One session's participant in one double barrier: its keys, its **local turn** (one
//! participant per session and name at a time; the sweep of a late-applied join and the
//! removals in the background own it too), and the removals that run in the background.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};

use tokio::sync::{Mutex as LocalTurnMutex, OwnedMutexGuard};

use crate::client::follow::Follow;
use crate::client::removal::{self, Owned};
use crate::recipes::barriers::double_barrier::round::READY;
use crate::recipes::barriers::double_barrier::steps::{self, Place};
use crate::session::Session;
use crate::support::kv::LeaseHex;

/// A session's participant in the double barrier `name`.
#[derive(Clone)]
pub(crate) struct Participant {
    pub(crate) session: Session,
    pub(crate) name: Vec<u8>,
    pub(crate) prefix: Vec<u8>,
    /// `<name>/<lease hex>`.
    pub(crate) key: Vec<u8>,
    /// `<name>/ready`.
    pub(crate) ready: Vec<u8>,
    /// How many participants a round has.
    pub(crate) count: u64,
    /// Owned from `enter` to the end of `leave`, and by a sweep or a removal meanwhile.
    pub(crate) local_turn: Arc<LocalTurnMutex<()>>,
}

/// The local turns of every session and name in this process, kept apart from the handles:
/// a removal in the background may own a turn after its `DoubleBarrier` is gone.
static LOCAL_TURNS: StdMutex<LocalTurns> = StdMutex::new(BTreeMap::new());

/// LocalTurns by session serial and name.
type LocalTurns = BTreeMap<(u64, Vec<u8>), Weak<LocalTurnMutex<()>>>;

impl Participant {
    /// `session`'s participant in the double barrier `name` for `count` (both checked by
    /// the caller).
    pub(crate) fn new(session: &Session, name: Vec<u8>, count: u64) -> Participant {
        let mut prefix = name.clone();
        prefix.push(b'/');
        let mut key = prefix.clone();
        key.extend_from_slice(LeaseHex(session.lease_id()).to_string().as_bytes());
        let ready = [prefix.as_slice(), READY].concat();
        Participant {
            local_turn: local_turn_of(session, &name),
            session: session.clone(),
            name,
            prefix,
            key,
            ready,
            count,
        }
    }

    /// Runs `f` with this participant's [`Place`].
    pub(crate) fn with_place<T>(&self, f: impl FnOnce(&Place<'_>) -> T) -> T {
        let client = self.session.client();
        let sweep = |from: i64| self.sweep(from);
        f(&Place {
            rpc: client.rpc(),
            watches: client.watches(),
            session: self.session.lease(),
            prefix: &self.prefix,
            key: &self.key,
            ready: &self.ready,
            count: self.count,
            sweep: &sweep,
        })
    }

    /// Has the client's follow task delete a key of our lease that appears at our key from
    /// revision `from` on while the local turn is free (a join applied late:
    /// `client/follow.rs`).
    fn sweep(&self, from: i64) {
        self.session.client().follower().follow(Follow::Sweep {
            key: self.key.clone(),
            from,
            local_turn: self.local_turn.clone(),
            session: self.session.lease().clone(),
        });
    }

    /// Removes our key (created at `created`) in a task that owns `local_turn` until etcd
    /// answers (retried while the session lives); the receiver hears when it is done.
    /// With `then_ready`, a ready key left with nobody of its round is removed too.
    pub(crate) fn remove_in_background(
        &self,
        created: i64,
        local_turn: OwnedMutexGuard<()>,
        then_ready: bool,
    ) -> tokio::sync::oneshot::Receiver<()> {
        let (done, removed) = tokio::sync::oneshot::channel();
        let rpc = self.session.client().rpc().clone();
        let session = self.session.lease().clone();
        let (key, prefix, ready) = (self.key.clone(), self.prefix.clone(), self.ready.clone());
        let count = self.count;
        self.session.client().spawn(async move {
            let owned = Owned::Revision(created);
            let removed = session
                .retry_while_alive(|| removal::remove(&rpc, &key, owned))
                .await;
            drop(local_turn);
            if then_ready && removed.is_ok() {
                steps::clear_stale_ready(&rpc, (&prefix, count), &ready).await;
            }
            let _ = done.send(());
        });
        removed
    }

    /// After a join cut short: removes a key of our lease (it may have been created) and
    /// has it swept, in a task that owns `local_turn` until etcd answered the removal.
    pub(crate) fn remove_unknown_in_background(
        &self,
        local_turn: OwnedMutexGuard<()>,
    ) -> tokio::sync::oneshot::Receiver<()> {
        let (done, removed) = tokio::sync::oneshot::channel();
        let me = self.clone();
        self.session.client().spawn(async move {
            let rpc = me.session.client().rpc();
            let sweep = |from: i64| me.sweep(from);
            steps::remove_unknown(rpc, &me.key, me.session.lease_id(), &sweep).await;
            drop(local_turn);
            let _ = done.send(());
        });
        removed
    }
}

fn local_turn_of(session: &Session, name: &[u8]) -> Arc<LocalTurnMutex<()>> {
    let mut local_turns = LOCAL_TURNS.lock().unwrap_or_else(|e| e.into_inner());
    let id = (session.lease().serial(), name.to_vec());
    if let Some(local_turn) = local_turns.get(&id).and_then(Weak::upgrade) {
        return local_turn;
    }
    local_turns.retain(|_, local_turn| local_turn.strong_count() > 0);
    let local_turn = Arc::new(LocalTurnMutex::new(()));
    local_turns.insert(id, Arc::downgrade(&local_turn));
    local_turn
}
