//! Leader election: campaign / proclaim / resign / leader / observe, on etcd's election
//! recipe (and wire format), with a [`Leadership`] guard that resigns on `Drop`.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use crate::error::TryLockError;
use crate::error::{Error, Result};
use crate::kv::prefix_end;
use crate::kv::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnResponse};
use crate::mutex::guarded_txn;
use crate::ownership::{self, Held, Kind, Line, Wait};
use crate::queue;
use crate::session::Session;
use crate::transport::Rpc;
use crate::transport::watch::{EventKind, Only, Watch, WatchStream};

/// A leader election named by a string, campaigned through a [`Session`].
///
/// Candidates' keys are `<name>/<lease id in hex>` holding the candidate's value; the
/// oldest key leads. The campaign transaction is the one of etcd's Go
/// `concurrency.Election`, so candidates started with `etcdctl elect` and ours share one
/// line. One session has one key per name: campaigning again on the same session and name
/// proclaims the new value instead of queueing twice (as in Go).
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let session = client.session()?;
/// let election = session.election("scheduler")?;
/// let leadership = election.campaign("host-a:8080")?; // blocks until we lead
/// assert!(leadership.is_leader());
/// leadership.proclaim("host-a:9090")?;
/// drop(leadership); // resigns
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    line: Arc<Line>,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("key", &String::from_utf8_lossy(self.line.key()))
            .finish()
    }
}

/// The current leader of an election.
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// if let Some(leader) = session.election("scheduler")?.leader()? {
///     println!("{} leads with {}", leader.key_str(), leader.value_str());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's key, `<name>/<lease hex>`.
    pub key: Vec<u8>,
    /// The value the leader proclaimed.
    pub value: Vec<u8>,
    /// The key's create revision: the leader's fencing token.
    pub create_revision: i64,
    /// The revision of the last proclamation.
    pub mod_revision: i64,
    /// The leader's lease id.
    pub lease: i64,
}

impl Leader {
    /// The key as text.
    ///
    /// ```
    /// let l = etcd_sync::Leader { key: b"e/1".to_vec(), value: vec![], create_revision: 1, mod_revision: 1, lease: 1 };
    /// assert_eq!(l.key_str(), "e/1");
    /// ```
    pub fn key_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.key)
    }

    /// The value as text.
    ///
    /// ```
    /// let l = etcd_sync::Leader { key: vec![], value: b"v".to_vec(), create_revision: 1, mod_revision: 1, lease: 1 };
    /// assert_eq!(l.value_str(), "v");
    /// ```
    pub fn value_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.value)
    }
}

impl From<KeyValue> for Leader {
    fn from(kv: KeyValue) -> Self {
        Leader {
            key: kv.key,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            lease: kv.lease,
        }
    }
}

/// A change seen by an [`Observer`].
///
/// ```
/// use etcd_sync::LeaderEvent;
/// fn describe(e: &LeaderEvent) -> String {
///     match e {
///         LeaderEvent::Elected(l) => format!("new leader {}", l.value_str()),
///         LeaderEvent::Proclaimed(l) => format!("leader says {}", l.value_str()),
///         LeaderEvent::NoLeader => "no leader".into(),
///     }
/// }
/// assert_eq!(describe(&LeaderEvent::NoLeader), "no leader");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderEvent {
    /// A (new) leader: the first event when there is one, then every leader change.
    Elected(Leader),
    /// The same leader proclaimed a new value.
    Proclaimed(Leader),
    /// Nobody leads (the first event when the election is empty, or after the last
    /// candidate left).
    NoLeader,
}

impl Session {
    /// An election named `name` on this session. No request is sent until you use it.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let election = session.election("scheduler")?;
    /// # let _ = election;
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: impl AsRef<[u8]>) -> Result<Election> {
        Ok(Election {
            line: Line::of(self, name.as_ref())?,
        })
    }
}

impl Election {
    /// The election's name.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert_eq!(session.election("e")?.name(), b"e");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &[u8] {
        self.line.name()
    }

    /// Blocks until we lead, then returns the guard. Our value is stored under our key
    /// while we wait. Ends at once with [`Error::SessionLost`] if the session is lost,
    /// [`Error::NotLeader`] if our key is deleted by someone else; on every error our key
    /// is removed.
    ///
    /// One session has one key per name. Campaigning again while this session leads under
    /// the name (from any thread) re-campaigns, as in Go: the new value is proclaimed and
    /// the new [`Leadership`] supersedes the old one, which then reports
    /// `is_leader() == false`, fires `lost()`, and does nothing on `Drop`. A campaign while
    /// another thread of this session *waits* under the name, or holds a [`Mutex`](crate::Mutex)
    /// of the same name, takes turns with it.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let leadership = session.election("scheduler")?.campaign("host-a")?;
    /// println!("leading with token {}", leadership.fencing_token());
    /// # Ok(()) }
    /// ```
    pub fn campaign(&self, value: impl AsRef<[u8]>) -> Result<Leadership> {
        self.campaign_until(value.as_ref(), Wait::Forever)
    }

    /// Like [`campaign`](Election::campaign), but gives up with [`Error::Timeout`] after
    /// `timeout`, leaving no key behind.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let e = session.election("scheduler")?;
    /// match e.campaign_timeout("host-a", std::time::Duration::from_secs(1)) {
    ///     Ok(_leadership) => println!("leading"),
    ///     Err(etcd_sync::Error::Timeout { .. }) => println!("someone else leads"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn campaign_timeout(
        &self,
        value: impl AsRef<[u8]>,
        timeout: Duration,
    ) -> Result<Leadership> {
        self.campaign_until(value.as_ref(), Wait::from_timeout(timeout))
    }

    fn campaign_until(&self, value: &[u8], wait: Wait) -> Result<Leadership> {
        crate::runtime::ensure_blocking_allowed()?;
        let span =
            tracing::debug_span!("campaign", key = %String::from_utf8_lossy(self.line.key()));
        let _entered = span.enter();
        if let Some(hold) = self.line.live_hold()
            && hold.kind() == Kind::Lead
        {
            // Re-campaign: proclaim first (the old guard stays valid if that fails), then
            // hand the hold to a new guard.
            if !ownership::proclaim(&hold, value)? {
                return Err(Error::NotLeader);
            }
            let held = Held::supersede(&hold).ok_or(Error::NotLeader)?;
            tracing::info!(fencing_token = held.rev(), "re-campaigned");
            return Ok(Leadership { held });
        }
        let held =
            ownership::acquire(&self.line, Kind::Lead, value, wait).map_err(|e| match e {
                TryLockError::Error(Error::LockLost) | TryLockError::WouldBlock => Error::NotLeader,
                TryLockError::Error(other) => other,
            })?;
        tracing::info!(fencing_token = held.rev(), "elected leader");
        Ok(Leadership { held })
    }

    /// The current leader, or `Ok(None)` when nobody leads.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// match session.election("scheduler")?.leader()? {
    ///     Some(leader) => println!("leader: {}", leader.value_str()),
    ///     None => println!("no leader"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn leader(&self) -> Result<Option<Leader>> {
        leader_of(self.line.session().client(), self.line.prefix().to_vec())
    }

    /// Follows leadership changes: a blocking iterator of [`LeaderEvent`]s that starts with
    /// the current state (a leader or [`LeaderEvent::NoLeader`]). It survives compaction and
    /// broken watch streams (it re-reads the current leader), and only ever reports a key
    /// that was the leader at the revision it read. Dropping it cancels its watch.
    ///
    /// ```no_run
    /// use etcd_sync::LeaderEvent;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// for event in session.election("scheduler")?.observe()? {
    ///     match event? {
    ///         LeaderEvent::Elected(l) | LeaderEvent::Proclaimed(l) => println!("leader: {}", l.value_str()),
    ///         LeaderEvent::NoLeader => println!("no leader"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn observe(&self) -> Result<Observer> {
        observe_prefix(
            self.line.session().client().clone(),
            self.line.prefix().to_vec(),
        )
    }
}

impl crate::Client {
    /// The current leader of election `name`, without a session: `Ok(None)` when nobody
    /// leads. Same as [`Election::leader`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// if let Some(leader) = client.leader("scheduler")? {
    ///     println!("{}", leader.value_str());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn leader(&self, name: impl AsRef<[u8]>) -> Result<Option<Leader>> {
        leader_of(self, queue::key_prefix(name.as_ref())?)
    }

    /// Follows election `name` without a session (no lease is granted): same as
    /// [`Election::observe`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let observer = client.observe("scheduler")?;
    /// println!("{:?}", observer.recv()?);
    /// # Ok(()) }
    /// ```
    pub fn observe(&self, name: impl AsRef<[u8]>) -> Result<Observer> {
        observe_prefix(self.clone(), queue::key_prefix(name.as_ref())?)
    }
}

fn leader_of(client: &crate::Client, prefix: Vec<u8>) -> Result<Option<Leader>> {
    client.call(|rpc| async move { current_leader(&rpc, &prefix).await.map(|(l, _)| l) })
}

/// Starts the observer task for `prefix` on the client's runtime.
fn observe_prefix(client: crate::Client, prefix: Vec<u8>) -> Result<Observer> {
    crate::runtime::ensure_blocking_allowed()?;
    let (events_tx, events) = crossbeam_channel::bounded(OBSERVER_BUFFER);
    let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
    let rpc = client.rpc().clone();
    client.spawn(async move {
        tokio::select! {
            _ = cancelled => {}
            _ = observe_loop(rpc, prefix, events_tx) => {}
        }
    });
    Ok(Observer {
        events,
        _cancel: cancel,
        _client: client,
    })
}

/// Reads the oldest key under `prefix` (linearizable) and the revision of the read.
async fn current_leader(rpc: &Rpc, prefix: &[u8]) -> Result<(Option<Leader>, i64)> {
    let read = rpc.read(&queue::first_created(prefix)).await?;
    Ok((read.kvs.into_iter().next().map(Leader::from), read.revision))
}

/// How many events an [`Observer`] buffers for a consumer that does not keep up. Past
/// that, changes are coalesced: when room frees up, one event takes the consumer from what
/// it saw last to the current state, so memory stays bounded and nothing current is lost.
pub(crate) const OBSERVER_BUFFER: usize = 256;

/// The observer's side of the channel: remembers what the consumer saw last, and
/// coalesces while the buffer is full.
struct Outbox {
    events: Sender<Result<LeaderEvent>>,
    delivered: Option<Option<Leader>>,
    behind: bool,
}

impl Outbox {
    /// Offers `event`, the transition to `now`; false once the observer is dropped.
    fn offer(&mut self, event: LeaderEvent, now: &Option<Leader>) -> bool {
        if self.behind {
            return self.catch_up(now);
        }
        match self.events.try_send(Ok(event)) {
            Ok(()) => {
                self.delivered = Some(now.clone());
                true
            }
            Err(crossbeam_channel::TrySendError::Full(_)) => {
                self.behind = true;
                true
            }
            Err(crossbeam_channel::TrySendError::Disconnected(_)) => false,
        }
    }

    /// Once the consumer has room again: one event from what it saw last to `now`.
    fn catch_up(&mut self, now: &Option<Leader>) -> bool {
        if self.events.is_full() {
            // Still no room. (A dropped Observer cancels this task: no need to check.)
            return true;
        }
        self.behind = false;
        match diff(self.delivered.as_ref(), now) {
            Some(event) => self.offer(event, now),
            None => true,
        }
    }

    /// A final error (never blocks: if the buffer is full it is dropped, and the consumer
    /// sees the observer closed after draining).
    fn fail(&self, error: Error) {
        let _ = self.events.try_send(Err(error));
    }
}

/// The observer task: watch the prefix from now, re-read the leader whenever leadership
/// may have changed, and emit only differences.
async fn observe_loop(rpc: Rpc, prefix: Vec<u8>, events: Sender<Result<LeaderEvent>>) {
    let mut last: Option<Option<Leader>> = None;
    let mut retry_delay = Duration::from_millis(20);
    let mut outbox = Outbox {
        events,
        delivered: None,
        behind: false,
    };
    loop {
        let creates = vec![Watch {
            key: prefix.clone(),
            range_end: prefix_end(&prefix),
            start_revision: 0,
            only: Only::All,
        }];
        let mut watch = match WatchStream::open(&rpc, creates).await {
            Ok((watch, _)) => watch,
            Err(e) if e.is_transient() => {
                tokio::time::sleep(retry_delay).await;
                retry_delay = (retry_delay * 2).min(Duration::from_secs(1));
                continue;
            }
            Err(e) => {
                outbox.fail(e);
                return;
            }
        };
        // Read after the watcher exists: nothing between the read and the events is missed.
        let mut reread = true;
        loop {
            if reread {
                let current = match current_leader(&rpc, &prefix).await {
                    Ok((current, _)) => current,
                    Err(e) if e.is_transient() => break,
                    Err(e) => {
                        outbox.fail(e);
                        return;
                    }
                };
                if let Some(event) = diff(last.as_ref(), &current) {
                    tracing::debug!(?event, "leadership changed");
                    if !outbox.offer(event, &current) {
                        return;
                    }
                }
                last = Some(current);
                reread = false;
            }
            let next = tokio::select! {
                next = watch.next() => Some(next),
                _ = tokio::time::sleep(queue::STALE_CHECK) => None,
            };
            if outbox.behind && !outbox.catch_up(last.as_ref().unwrap_or(&None)) {
                return;
            }
            let response = match next {
                None if watch.is_stale(&rpc) => break,
                None => continue,
                Some(Ok(response)) if response.canceled => break,
                Some(Ok(response)) => response,
                Some(Err(_)) => break,
            };
            retry_delay = Duration::from_millis(20);
            for event in response.events {
                let kv = event.kv;
                let is_put = event.kind == EventKind::Put;
                match last.as_ref().and_then(Option::as_ref) {
                    // A new value under the leader's own key (same create revision): the
                    // same leader proclaimed. Reported from the event: no read needed.
                    // Events at or before our last read are already reflected in it.
                    Some(l)
                        if is_put
                            && kv.key == l.key
                            && kv.create_revision == l.create_revision
                            && kv.mod_revision > l.mod_revision =>
                    {
                        let proclaimed = Leader::from(kv);
                        let now = Some(proclaimed.clone());
                        if !outbox.offer(LeaderEvent::Proclaimed(proclaimed), &now) {
                            return;
                        }
                        last = Some(now);
                    }
                    // The leader's key went away: someone else (or nobody) leads now.
                    Some(l) if !is_put && kv.key == l.key => reread = true,
                    // A candidate joined an empty election.
                    None if is_put => reread = true,
                    _ => {}
                }
            }
        }
        tokio::time::sleep(retry_delay).await;
        retry_delay = (retry_delay * 2).min(Duration::from_secs(1));
    }
}

/// The event that takes an observer from `last` to `current`, if anything changed.
fn diff(last: Option<&Option<Leader>>, current: &Option<Leader>) -> Option<LeaderEvent> {
    match (last, current) {
        (Some(None), None) => None,
        (_, None) => Some(LeaderEvent::NoLeader),
        (Some(Some(prev)), Some(now))
            if prev.key == now.key && prev.create_revision == now.create_revision =>
        {
            (prev.mod_revision != now.mod_revision).then(|| LeaderEvent::Proclaimed(now.clone()))
        }
        (_, Some(now)) => Some(LeaderEvent::Elected(now.clone())),
    }
}

/// A blocking stream of leadership changes from [`Election::observe`]. Iterate it, or use
/// [`recv`](Observer::recv) / [`recv_timeout`](Observer::recv_timeout). Dropping it stops
/// the watch.
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let observer = session.election("scheduler")?.observe()?;
/// while let Some(event) = observer.recv_timeout(std::time::Duration::from_secs(5))? {
///     println!("{event:?}");
/// }
/// # Ok(()) }
/// ```
pub struct Observer {
    events: Receiver<Result<LeaderEvent>>,
    _cancel: tokio::sync::oneshot::Sender<()>,
    // Keeps the runtime that runs the observer task alive.
    _client: crate::Client,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

impl Observer {
    /// Blocks until the next change.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let observer = session.election("e")?.observe()?;
    /// let first = observer.recv()?; // the current state
    /// # let _ = first;
    /// # Ok(()) }
    /// ```
    pub fn recv(&self) -> Result<LeaderEvent> {
        crate::runtime::ensure_blocking_allowed()?;
        self.events.recv().map_err(|_| Error::Closed)?
    }

    /// Waits up to `timeout` for the next change; `Ok(None)` if none came.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let observer = session.election("e")?.observe()?;
    /// if let Some(event) = observer.recv_timeout(std::time::Duration::from_millis(100))? {
    ///     println!("{event:?}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<LeaderEvent>> {
        crate::runtime::ensure_blocking_allowed()?;
        match self.events.recv_timeout(timeout) {
            Ok(event) => event.map(Some),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(Error::Closed),
        }
    }

    /// The next change if one is ready, without blocking.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let observer = session.election("e")?.observe()?;
    /// let _maybe = observer.try_recv()?;
    /// # Ok(()) }
    /// ```
    pub fn try_recv(&self) -> Result<Option<LeaderEvent>> {
        match self.events.try_recv() {
            Ok(event) => event.map(Some),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(Error::Closed),
        }
    }
}

impl Iterator for Observer {
    type Item = Result<LeaderEvent>;

    /// Blocks for the next change; ends (`None`) only when the observer stopped after an
    /// error it already yielded.
    fn next(&mut self) -> Option<Self::Item> {
        if crate::runtime::inside_async() {
            return Some(Err(Error::InsideAsyncRuntime));
        }
        self.events.recv().ok()
    }
}

/// Proof that we lead; resigns on `Drop`.
///
/// Resigning deletes our key only if it still has our create revision. If
/// [`resign`](Leadership::resign) fails, the guard keeps its state so calling it again
/// works (upstream Go forgets it).
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let mut leadership = session.election("scheduler")?.campaign("host-a")?;
/// crossbeam_channel::select! {
///     recv(leadership.lost()) -> _ => eprintln!("leadership lost: stop leading"),
///     default(std::time::Duration::from_secs(1)) => println!("led for a second"),
/// }
/// leadership.resign()?;
/// # Ok(()) }
/// ```
#[must_use = "leadership is resigned as soon as the guard is dropped"]
pub struct Leadership {
    held: Held,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("key", &String::from_utf8_lossy(self.key()))
            .field("fencing_token", &self.held.rev())
            .field("is_leader", &self.is_leader())
            .finish()
    }
}

impl Leadership {
    /// Our election key, `<name>/<lease hex>`.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let l = session.election("e")?.campaign("v")?;
    /// assert!(l.key().starts_with(b"e/"));
    /// # Ok(()) }
    /// ```
    pub fn key(&self) -> &[u8] {
        self.held.key()
    }

    /// Our election key as text.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// println!("{}", session.election("e")?.campaign("v")?.key_str());
    /// # Ok(()) }
    /// ```
    pub fn key_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(self.key())
    }

    /// Our key's create revision: strictly increasing across successive leaders.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let l = session.election("e")?.campaign("v")?;
    /// println!("token {}", l.fencing_token());
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> i64 {
        self.held.rev()
    }

    /// Whether we still lead as far as this process knows: not resigned nor superseded by
    /// a re-campaign, the session's lease deadline has not passed, and our key has not
    /// been seen deleted. No request is sent.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// assert!(session.election("e")?.campaign("v")?.is_leader());
    /// # Ok(()) }
    /// ```
    pub fn is_leader(&self) -> bool {
        self.held.is_held()
    }

    /// A channel that becomes ready (disconnected) when leadership may be lost or is given
    /// up: the session's lease deadline passed or the session ended, our key was seen
    /// deleted, a re-campaign superseded this guard, or it resigned.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let l = session.election("e")?.campaign("v")?;
    /// let lost = l.lost();
    /// std::thread::spawn(move || { let _ = lost.recv(); eprintln!("no longer leader"); });
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> Receiver<()> {
        self.held.lost()
    }

    /// Publishes a new value under our key, only while we lead; [`Error::NotLeader`] if we
    /// no longer do. Exactly once: a retried attempt that etcd applies late can never
    /// overwrite a newer value.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let l = session.election("e")?.campaign("starting")?;
    /// l.proclaim("ready")?;
    /// # Ok(()) }
    /// ```
    pub fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<()> {
        crate::runtime::ensure_blocking_allowed()?;
        if self.held.proclaim(value.as_ref())? {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// The condition "we still lead", for your own transactions.
    ///
    /// ```no_run
    /// use etcd_sync::{Txn, TxnOp};
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let l = session.election("e")?.campaign("v")?;
    /// session.client().txn(Txn::new().when([l.ownership_compare()]).and_then([TxnOp::put("k", "v")]))?;
    /// # Ok(()) }
    /// ```
    pub fn ownership_compare(&self) -> Compare {
        Compare::create_revision(self.key().to_vec(), CompareOp::Equal, self.held.rev())
    }

    /// Puts `key = value` only while we lead; [`Error::NotLeader`] otherwise.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let l = session.election("e")?.campaign("v")?;
    /// l.put("config/written-by", "the leader")?;
    /// # Ok(()) }
    /// ```
    pub fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<TxnResponse> {
        self.txn(Txn::new().and_then([TxnOp::put(key.as_ref(), value.as_ref())]))
    }

    /// Deletes `key` only while we lead; [`Error::NotLeader`] otherwise.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let l = session.election("e")?.campaign("v")?;
    /// l.delete("config/stale")?;
    /// # Ok(()) }
    /// ```
    pub fn delete(&self, key: impl AsRef<[u8]>) -> Result<TxnResponse> {
        self.txn(Txn::new().and_then([TxnOp::delete(key.as_ref())]))
    }

    /// Runs `txn` only while we lead, atomically with that check.
    ///
    /// ```no_run
    /// use etcd_sync::{Txn, TxnOp};
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let l = session.election("e")?.campaign("v")?;
    /// l.txn(Txn::new().and_then([TxnOp::put("a", "1"), TxnOp::put("b", "2")]))?;
    /// # Ok(()) }
    /// ```
    pub fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        // A superseded or resigned guard must not write, although etcd would still see
        // the same key and revision.
        if !self.held.is_current() {
            return Err(Error::NotLeader);
        }
        guarded_txn(
            self.held.line().session().client(),
            self.ownership_compare(),
            txn,
        )
        .and_then(|r| r.ok_or(Error::NotLeader))
    }

    /// Gives up leadership (deletes our key if it still has our create revision). Returns
    /// within about one request timeout; if etcd has not answered by then, this returns
    /// [`Error::Timeout`] while the resignation goes on in the background, and calling
    /// `resign` again waits for it once more. After success (or on a guard superseded by a
    /// re-campaign) it does nothing.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let mut l = session.election("e")?.campaign("v")?;
    /// while let Err(e) = l.resign() {
    ///     eprintln!("resign not confirmed yet: {e}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn resign(&mut self) -> Result<()> {
        crate::runtime::ensure_blocking_allowed()?;
        let wait = self.held.line().session().client().rpc().request_timeout();
        self.held.release(Some(wait)).map(|_| ())
    }
}
