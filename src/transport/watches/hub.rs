//! The watch task: one stream at a time, carrying every watcher of the client; commands
//! from the handles add and remove subscribers; etcd's answers are dispatched by watch id.
//!
//! A watcher whose history can no longer be followed (etcd reports its resume revision
//! compacted, in the create answer or in a later cancelled response, or the server sends
//! events that go back in time) starts again from now on the same stream, and its
//! subscribers are told to read once: never the same compacted revision again. Timed
//! progress notifications move a quiet watcher's resume revision forward, so a break after
//! a compaction usually finds it still resumable.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;

use super::watcher::{Recheck, Watcher};
use super::{Command, Delivery, Spec, UNSYNCED_WINDOW};
use crate::support::backoff::Backoff;
use crate::support::error::Result;
use crate::support::sim::{Mutation, mutation};
use crate::transport::Rpc;
use crate::transport::watch::{WatchResponse, WatchStream, cancel_error};

/// The task's state, kept across streams.
#[derive(Default)]
pub(super) struct Hub {
    watchers: BTreeMap<Spec, Watcher>,
    /// Watch id → spec, for the current stream.
    by_id: BTreeMap<i64, Spec>,
    next_id: i64,
    /// When the current stream opened (its creates answered), if it did.
    opened_at: Option<std::time::Instant>,
    /// The current stream's member has etcd #18089's fix (see [`Watcher::request`]).
    fixed: bool,
    /// Watchers created from now on a member without that fix, to be settled once synced
    /// ([`Hub::settle_unsynced`]): when, the spec, its watch id and its start's revision.
    unsynced: Vec<(std::time::Instant, Spec, i64, i64)>,
}

/// A stream that served this long was healthy (a member that breaks streams at once does
/// not get there): a break after it is news, and the next stream opens after the shortest
/// pause, not after the pauses of breaks past (a guard must hear of its key's deletion
/// within a second, also after a member restart that grew the pauses).
const HEALTHY: Duration = Duration::from_millis(100);

/// Through etcd's gRPC proxy, how long a watcher may go without an event before it is
/// created again from now (its subscribers read, if anything changed since they last
/// knew): the proxy has lost events (etcd #9988; #21813: a watcher joining a broadcast
/// whose own watch on etcd is broken hears nothing, ever), and a watcher that can miss one
/// must find out within a bound. A member never needs this: its watchers are checked by
/// etcd's own guarantees, and an idle client keeps no timer.
const PROXY_SILENCE: Duration = Duration::from_secs(1);

/// Why a stream ended.
enum Ended {
    /// Every handle is gone: the client was dropped.
    Commands,
    /// It went stale (the client moved to another endpoint): open a new one.
    Reopen,
}

pub(super) async fn run(rpc: Rpc, mut commands: UnboundedReceiver<Command>) {
    let mut hub = Hub::default();
    let mut backoff = Backoff::quick();
    loop {
        if hub.watchers.is_empty() {
            // A stream needs a first watcher (etcd answers headers with the first
            // response), so an idle client keeps none.
            match commands.recv().await {
                Some(command) => hub.apply(command, None),
                None => return,
            }
            continue;
        }
        match hub.serve(&rpc, &mut commands).await {
            Ok(Ended::Commands) => return,
            Ok(Ended::Reopen) => backoff.reset(),
            Err(e) => {
                tracing::debug!(error = %e, "watch stream failed; reopening");
                if hub
                    .opened_at
                    .take()
                    .is_some_and(|at| crate::support::clock::since(at) >= HEALTHY)
                {
                    backoff.reset();
                }
                // Commands keep arriving while we wait.
                let pause = backoff.next_pause();
                let until = tokio::time::Instant::now() + pause;
                loop {
                    tokio::select! {
                        command = commands.recv() => match command {
                            Some(command) => hub.apply(command, None),
                            None => return,
                        },
                        _ = tokio::time::sleep_until(until) => break,
                    }
                }
            }
        }
        hub.stream_closed();
    }
}

impl Hub {
    fn next_watch_id(&mut self) -> i64 {
        // Never 0 (etcd reads 0 as "choose an id"), and never a number etcd's gRPC proxy
        // gives (`transport/watch_ids.rs`).
        self.next_id = self.next_id.max(crate::transport::watch_ids::FIRST_OWN_ID) + 1;
        self.next_id
    }

    /// The stream ended: the watchers nobody wants go (their etcd watchers went with it; a
    /// subscriber that went without a word leaves one behind until then), and every other
    /// one is to be created again on the next stream (no id there, nothing confirmed: a
    /// create the proxy does not confirm must be noticed there too).
    fn stream_closed(&mut self) {
        self.watchers.retain(|_, watcher| watcher.is_wanted());
        self.by_id.clear();
        for watcher in self.watchers.values_mut() {
            watcher.id = None;
            watcher.created = false;
        }
    }

    /// Applies a command; `stream` is the live stream, if one runs.
    fn apply(&mut self, command: Command, stream: Option<&WatchStream>) {
        match command {
            Command::Subscribe {
                spec,
                id,
                known,
                from_known,
                mut receiver,
            } => {
                let watcher = self.watchers.entry(spec.clone()).or_default();
                if from_known && watcher.is_new() {
                    watcher.start_at(known);
                }
                // A watcher that started once covers everything after `through`, also
                // between streams (it is re-created from there); one that has not started
                // yet tells its subscribers where it starts when etcd confirms it.
                if watcher.through.is_some() {
                    watcher.welcome(&mut receiver, known);
                }
                watcher.subscribers.insert(id, receiver);
                self.ensure_created(&spec, stream);
            }
            Command::Replace {
                spec,
                id,
                known,
                mut receiver,
            } => {
                let Some(watcher) = self.watchers.get_mut(&spec) else {
                    return;
                };
                if watcher.subscribers.remove(&id).is_none() {
                    return;
                }
                if watcher.through.is_some() {
                    watcher.take_up(&mut receiver, known);
                }
                watcher.subscribers.insert(id, receiver);
            }
            Command::Unsubscribe { spec, id } => {
                if let Some(watcher) = self.watchers.get_mut(&spec) {
                    watcher.subscribers.remove(&id);
                }
                self.cancel_if_unwanted(&spec, stream);
            }
            Command::Pin(spec, known) => {
                let watcher = self.watchers.entry(spec.clone()).or_default();
                if let Some(known) = known.filter(|&k| k > 0 && watcher.is_new()) {
                    watcher.start_at(known);
                }
                watcher.pins += 1;
                self.ensure_created(&spec, stream);
            }
            Command::Unpin(spec) => {
                if let Some(watcher) = self.watchers.get_mut(&spec) {
                    watcher.pins = watcher.pins.saturating_sub(1);
                }
                self.cancel_if_unwanted(&spec, stream);
            }
        }
    }

    /// Sends the create request for `spec` on the live stream, if it has none there yet.
    fn ensure_created(&mut self, spec: &Spec, stream: Option<&WatchStream>) {
        let Some(stream) = stream else {
            return; // the next stream creates it
        };
        let id = self.next_watch_id();
        let Some(watcher) = self.watchers.get_mut(spec) else {
            return;
        };
        if watcher.id.is_some() {
            return;
        }
        // A failed send means the stream is closing; the next one creates the watcher.
        if stream
            .send_create(&watcher.request(spec, id, self.fixed))
            .is_ok()
        {
            watcher.sent(id, self.fixed);
            self.by_id.insert(id, spec.clone());
        }
    }

    fn cancel_if_unwanted(&mut self, spec: &Spec, stream: Option<&WatchStream>) {
        let Some(watcher) = self.watchers.get(spec) else {
            return;
        };
        if watcher.is_wanted() {
            return;
        }
        if let (Some(id), Some(stream)) = (watcher.id, stream) {
            // etcd handles requests in order: this cancel follows the create even if the
            // create is not answered yet. Late answers for the id are ignored.
            let _ = stream.send_cancel(id);
            self.by_id.remove(&id);
        }
        self.watchers.remove(spec);
    }

    /// Runs one stream until it breaks, goes stale, or the client is dropped.
    async fn serve(
        &mut self,
        rpc: &Rpc,
        commands: &mut UnboundedReceiver<Command>,
    ) -> Result<Ended> {
        let specs: Vec<Spec> = self.watchers.keys().cloned().collect();
        let mut ids = Vec::with_capacity(specs.len());
        for spec in &specs {
            let id = self.next_watch_id();
            ids.push(id);
            self.by_id.insert(id, spec.clone());
        }
        // Both ways: which one goes depends on the member the stream opens on.
        let [unfixed, fixed] = [false, true].map(|fixed| {
            specs
                .iter()
                .zip(&ids)
                .filter_map(|(spec, &id)| Some(self.watchers.get(spec)?.request(spec, id, fixed)))
                .collect::<Vec<_>>()
        });
        let creates = |on_fixed: bool| {
            if on_fixed {
                fixed.clone()
            } else {
                unfixed.clone()
            }
        };
        // Made before the stream opens, so that a move while it opens is heard too.
        let mut moves = rpc.moves();
        let (mut stream, created, _) = WatchStream::open_tolerant(rpc, creates).await?;
        self.fixed = created.keeps_compacted_deletes;
        for (spec, &id) in specs.iter().zip(&ids) {
            if let Some(watcher) = self.watchers.get_mut(spec) {
                watcher.sent(id, self.fixed);
            }
        }
        self.opened_at = Some(crate::support::clock::now());
        for answer in created.answers {
            self.on_created(answer, &stream);
        }
        // Told when the client moves to another endpoint (a frozen member sends no events
        // and no error: watchers follow the client), with no timer to wake an idle client.
        let mut moved = true;
        let mut recheck = tokio::time::interval(PROXY_SILENCE / 2);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let unsynced = self.next_unsynced();
            tokio::select! {
                due = async {
                    match unsynced {
                        Some(due) => {
                            tokio::time::sleep_until(due.into()).await;
                            due
                        }
                        None => std::future::pending().await,
                    }
                } => self.settle_unsynced(due),
                _ = recheck.tick(), if stream.server_numbers_watchers() => {
                    self.recheck_through_proxy(&stream, rpc.request_timeout())?;
                }
                command = commands.recv() => match command {
                    Some(command) => self.apply(command, Some(&stream)),
                    None => return Ok(Ended::Commands),
                },
                response = stream.next() => {
                    let response = response?;
                    if response.created {
                        if response.canceled && rpc.can_reauthenticate(&cancel_error(&response)) {
                            // The token expired: the next stream opens with a fresh one.
                            return Err(cancel_error(&response));
                        }
                        self.on_created(response, &stream);
                    } else if response.canceled {
                        self.on_canceled(&response, &stream)?;
                    } else if response.events.is_empty() {
                        self.on_progress(&response);
                    } else {
                        self.on_events(response, &stream);
                    }
                }
                changed = moves.changed(), if moved => {
                    // The sender lives as long as `rpc`; should it be gone, nothing moves.
                    moved = changed.is_ok();
                    if stream.is_stale(rpc) {
                        return Ok(Ended::Reopen);
                    }
                }
            }
        }
    }

    /// Through a proxy: a create it has not confirmed within a request timeout ends the
    /// stream (the next one starts afresh), and a watcher silent for [`PROXY_SILENCE`] starts
    /// again from now.
    fn recheck_through_proxy(&mut self, stream: &WatchStream, limit: Duration) -> Result<()> {
        let now = crate::support::clock::now();
        let mut silent = Vec::new();
        for (spec, watcher) in &self.watchers {
            match watcher.through_proxy(now, limit, PROXY_SILENCE) {
                Recheck::Unconfirmed => {
                    return Err(crate::support::error::Error::unavailable(
                        "etcd's gRPC proxy did not confirm a watcher",
                    ));
                }
                Recheck::Silent => silent.push(spec.clone()),
                Recheck::Fine => {}
            }
        }
        for spec in silent {
            self.restart(&spec, stream, 0);
        }
        Ok(())
    }

    /// etcd's answer to a create request.
    fn on_created(&mut self, answer: WatchResponse, stream: &WatchStream) {
        let Some(spec) = self.by_id.get(&answer.watch_id).cloned() else {
            return; // cancelled meanwhile
        };
        let Some(watcher) = self.watchers.get_mut(&spec) else {
            return;
        };
        if answer.canceled {
            if answer.compact_revision > 0 && watcher.through.is_some() {
                self.restart(&spec, stream, answer.compact_revision);
                return;
            }
            self.by_id.remove(&answer.watch_id);
            watcher.id = None;
            let error = cancel_error(&answer);
            tracing::debug!(error = %error, "etcd refused a watcher");
            watcher.broadcast(&Delivery::Failed(error));
            watcher.subscribers.clear();
            watcher.pins = 0;
            self.watchers.remove(&spec);
            return;
        }
        watcher.created = true;
        match watcher.through {
            // Re-created after a break: it continues where the last stream stopped.
            Some(_) => {}
            None => {
                watcher.start_fresh(answer.revision);
                if !self.fixed {
                    let due = crate::support::clock::now() + UNSYNCED_WINDOW;
                    self.unsynced
                        .push((due, spec, answer.watch_id, answer.revision));
                }
            }
        }
    }

    /// When the next watcher of [`Hub::unsynced`] is due, if any.
    fn next_unsynced(&self) -> Option<std::time::Instant> {
        self.unsynced.iter().map(|(due, ..)| *due).min()
    }

    /// A watcher created from now at revision `r` on a member without etcd #18089's fix
    /// may be registered unsynced, starting at `r + 1`; a compaction at exactly `r + 1`
    /// before etcd's sync loop reaches it drops the deletes at `r + 1` from what it sends
    /// (the sync finds its start not yet compacted, and the tombstones gone). Once it is
    /// synced (after [`UNSYNCED_WINDOW`]), its subscribers that know no further than `r`
    /// read once more: what came after their read reaches them as events. Not covered: a
    /// subscriber that joins after this knowing exactly `r` is not told (the history
    /// still claims `r`; claiming `r + 1` would have a subscriber whose read finds the
    /// store still at `r` told to read forever).
    fn settle_unsynced(&mut self, now: std::time::Instant) {
        let (due, later) = std::mem::take(&mut self.unsynced)
            .into_iter()
            .partition(|(at, ..)| *at <= now);
        self.unsynced = later;
        let due: Vec<(std::time::Instant, Spec, i64, i64)> = due;
        for (_, spec, id, revision) in due {
            let Some(watcher) = self.watchers.get_mut(&spec) else {
                continue;
            };
            if watcher.id != Some(id) || watcher.history_from > revision {
                continue; // started again since
            }
            watcher.broadcast(&Delivery::From {
                after: revision + 1,
                fresh: false,
            });
        }
    }

    /// etcd cancelled a watcher after creating it. With `compact_revision` it could not
    /// serve the watcher's resume revision (compacted while the stream was down; a
    /// watcher that fell behind while compaction ran): it starts again from now. etcd
    /// answers a create this way (`created`, then this), so reopening would try the same
    /// revision again forever. Any other reason: a new stream, after a pause.
    fn on_canceled(&mut self, response: &WatchResponse, stream: &WatchStream) -> Result<()> {
        let Some(spec) = self.by_id.get(&response.watch_id).cloned() else {
            return Ok(()); // cancelled by us
        };
        if response.compact_revision > 0 {
            self.restart(&spec, stream, response.compact_revision);
            return Ok(());
        }
        Err(cancel_error(response))
    }

    /// A response with no events, not a create or cancel answer: etcd's timed progress
    /// notification for one watcher (requested with the create).
    fn on_progress(&mut self, response: &WatchResponse) {
        let Some(spec) = self.by_id.get(&response.watch_id) else {
            return;
        };
        if let Some(watcher) = self.watchers.get_mut(spec) {
            watcher.progress(response.revision);
        }
    }

    fn on_events(&mut self, response: WatchResponse, stream: &WatchStream) {
        let Some(spec) = self.by_id.get(&response.watch_id).cloned() else {
            return;
        };
        let Some(watcher) = self.watchers.get_mut(&spec) else {
            return;
        };
        let mut events = response.events;
        if !watcher.skip_overlap(&mut events) {
            return;
        }
        if watcher.goes_back(&events) {
            // Not something to pass on as news: the events may not be the watcher's
            // history any more. Its subscribers read instead.
            tracing::warn!(
                through = watcher.through,
                first = events.first().map(|e| e.kv.mod_revision),
                "a watch response went back in time; watching again from now"
            );
            self.restart(&spec, stream, 0);
            return;
        }
        watcher.record(events);
    }

    /// Drops the watcher of `spec` from the stream and creates it again from now: the
    /// [`Delivery::From`] of the new start tells its subscribers to read.
    fn restart(&mut self, spec: &Spec, stream: &WatchStream, compacted: i64) {
        let Some(watcher) = self.watchers.get_mut(spec) else {
            return;
        };
        tracing::debug!(
            through = watcher.through,
            compacted,
            subscribers = watcher.subscribers.len(),
            "watcher history lost; watching again from now"
        );
        if let Some(id) = watcher.id {
            self.by_id.remove(&id);
            // etcd has usually dropped it already; if not, this ends it (its late answers
            // are ignored: the id is no longer ours).
            let _ = stream.send_cancel(id);
        }
        if compacted > 0 && mutation(Mutation::ResumeCompacted) {
            watcher.id = None;
            watcher.created = false;
            watcher.through = Some(compacted);
            self.ensure_created(spec, Some(stream));
            return;
        }
        watcher.forget();
        self.ensure_created(spec, Some(stream));
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Batch, Receiver};
    use super::*;
    use crate::transport::watch::Only;

    /// A pin with the revision its line was read at starts a watcher nobody has started
    /// right after that read; a pin of a running watcher leaves what it covers alone (moved
    /// to a later read, a break right after would resume it past events its subscribers
    /// have not had), and a read at revision 0 starts nothing (a watcher "covering" 0 but
    /// created from now would vouch for events it never asked for). (Mutation testing,
    /// shard 8/10: `hub.rs:184`, `&&` → `||` and `>` → `>=` in the pin's start.)
    #[test]
    fn a_pin_starts_only_a_new_watcher_and_only_at_a_read_revision() {
        let spec = Spec::prefix(b"l/", Only::Deletes);
        let mut hub = Hub::default();
        hub.apply(Command::Pin(spec.clone(), Some(0)), None);
        assert_eq!(
            hub.watchers[&spec].through, None,
            "from now: nothing covered"
        );
        let other = Spec::prefix(b"m/", Only::Deletes);
        hub.apply(Command::Pin(other.clone(), Some(10)), None);
        assert_eq!(
            hub.watchers[&other].through,
            Some(10),
            "right after the read"
        );
        hub.apply(Command::Pin(other.clone(), Some(30)), None);
        assert_eq!(
            hub.watchers[&other].through,
            Some(10),
            "a running watcher moved"
        );
        assert_eq!(hub.watchers[&other].pins, 2);
        hub.apply(Command::Unpin(other.clone()), None);
        hub.apply(Command::Unpin(other.clone()), None);
        assert!(!hub.watchers.contains_key(&other), "unpinned, it goes");
    }

    /// A subscriber that takes every delivery.
    struct Taking;

    impl Receiver for Taking {
        fn tell(&mut self, _: Delivery) -> bool {
            true
        }
        fn events(&mut self, _: &Batch) -> bool {
            true
        }
    }

    /// After a stream, the hub keeps only the watchers someone wants, each to be created
    /// again: no id on the next stream yet, not confirmed (through a proxy, a create it never
    /// confirms ends that stream only if it is known to be unconfirmed). (Mutation testing,
    /// shard 8/10: `Hub::prune` → `()` kept unwanted watchers for ever, re-created on every
    /// stream; `Hub::stream_closed` → `()` took every re-created watcher for confirmed.)
    #[test]
    fn a_closed_stream_leaves_the_wanted_watchers_to_be_created_again() {
        let (wanted, unwanted) = (
            Spec::prefix(b"l/", Only::Deletes),
            Spec::prefix(b"m/", Only::Deletes),
        );
        let mut hub = Hub::default();
        for (id, spec) in [(5, &wanted), (6, &unwanted)] {
            let watcher = hub.watchers.entry(spec.clone()).or_default();
            watcher.sent(id, true);
            watcher.created = true;
            hub.by_id.insert(id, spec.clone());
        }
        let subscriber: Box<dyn super::super::Receiver> = Box::new(Taking);
        hub.watchers
            .get_mut(&wanted)
            .map(|w| w.subscribers.insert(1, subscriber));
        hub.stream_closed();
        assert_eq!(hub.watchers.keys().collect::<Vec<_>>(), vec![&wanted]);
        let watcher = &hub.watchers[&wanted];
        assert_eq!((watcher.id, watcher.created), (None, false));
        assert!(hub.by_id.is_empty());
    }
}
