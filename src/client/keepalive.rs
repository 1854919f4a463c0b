//! The keep-alive thread: one named OS thread per client renews every session's lease over
//! one bidirectional `LeaseKeepAlive` stream, and declares a session lost the moment its
//! lease may have expired on the server.
//!
//! Timing rule (the safety property): etcd starts a lease's new TTL when it *processes* a
//! keep-alive, which is after we *sent* it. So `sent_at + ttl` (monotonic clock) is never
//! later than the server's expiry, and we declare the session lost at
//! `sent_at + ttl - safety_margin(ttl)` of the last acknowledged request.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

use crate::client::lease::{LeaseState, safety_margin};
use crate::support::backoff::Backoff;
use crate::support::error::loss::LossReason;
use crate::support::error::{Error, Result};
use crate::support::kv::LeaseHex;
use crate::transport::Rpc;
use crate::transport::lease::{KeepAliveReceiver, KeepAliveSender, Renewed};

/// A request unanswered this long means the stream (or its member) is stuck: drop it and
/// reopen, on the next endpoint. A quarter of the TTL, between 300 ms and 5 s, so a retry
/// always fits well before the deadline.
fn stall_after(ttl: Duration) -> Duration {
    (ttl / 4).clamp(Duration::from_millis(300), Duration::from_secs(5))
}

enum Command {
    Register(Arc<LeaseState>),
    Shutdown,
}

/// Handle to the keep-alive thread; dropping it stops and joins the thread.
pub(crate) struct KeepAlive {
    commands: UnboundedSender<Command>,
    thread: Option<JoinHandle<()>>,
}

impl KeepAlive {
    pub(crate) fn start(handle: tokio::runtime::Handle, rpc: Rpc) -> Result<KeepAlive> {
        let (commands, mut receiver) = unbounded_channel();
        let thread = std::thread::Builder::new()
            .name("etcd-sync-keepalive".into())
            .spawn(move || {
                // This thread runs the loop itself; whichever thread drives the runtime moves
                // its bytes (`client/driver.rs`).
                handle.block_on(Renewals::new(rpc).run(&mut receiver));
            })
            .map_err(|e| Error::Unavailable {
                endpoint: None,
                reason: format!("cannot start the keep-alive thread: {e}"),
                source: Some(std::sync::Arc::new(e)),
            })?;
        Ok(KeepAlive {
            commands,
            thread: Some(thread),
        })
    }

    /// The keep-alive loop as a task of `handle`'s runtime, not a thread of its own (a
    /// simulated run: `client/simulated.rs`).
    pub(crate) fn start_task(handle: &tokio::runtime::Handle, rpc: Rpc) -> KeepAlive {
        let (commands, mut receiver) = unbounded_channel();
        drop(handle.spawn(async move { Renewals::new(rpc).run(&mut receiver).await }));
        KeepAlive {
            commands,
            thread: None,
        }
    }

    /// Starts renewing a session's lease: the first keep-alive goes out at once.
    pub(crate) fn register(&self, session: Arc<LeaseState>) -> Result<()> {
        self.commands
            .send(Command::Register(session))
            .map_err(|_| Error::Closed)
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Lease {
    session: Arc<LeaseState>,
    ttl: Duration,
    next_send: Instant,
    /// Send times of requests not yet answered, oldest first (etcd answers a stream's
    /// requests in order).
    in_flight: VecDeque<Instant>,
}

type Opening = Pin<Box<dyn Future<Output = Result<KeepAliveReceiver>> + Send>>;

enum StreamState {
    /// The call is issued with its first requests queued; etcd answers headers together
    /// with the first response.
    Opening(Opening),
    Open(Box<KeepAliveReceiver>),
}

struct Stream {
    sender: KeepAliveSender,
    state: StreamState,
}

enum Event {
    Command(Option<Command>),
    Opened(Result<KeepAliveReceiver>),
    Message(Result<Option<Renewed>>),
    Timer,
}

struct Renewals {
    rpc: Rpc,
    leases: BTreeMap<i64, Lease>,
    stream: Option<Stream>,
    retry_at: Instant,
    backoff: Backoff,
    /// etcd refused our token: get a new one before opening the next stream.
    reauthenticate: bool,
}

impl Renewals {
    fn new(rpc: Rpc) -> Renewals {
        Renewals {
            rpc,
            leases: BTreeMap::new(),
            stream: None,
            retry_at: crate::support::clock::now(),
            backoff: Backoff::new(Duration::from_millis(50), Duration::from_secs(1)),
            reauthenticate: false,
        }
    }

    async fn run(mut self, commands: &mut tokio::sync::mpsc::UnboundedReceiver<Command>) {
        loop {
            self.expire_and_prune();
            self.detect_stall();
            self.send_due();
            let wake = self.next_wake();
            let event = tokio::select! {
                biased;
                command = commands.recv() => Event::Command(command),
                event = poll_stream(&mut self.stream) => event,
                _ = tokio::time::sleep_until(wake.into()) => Event::Timer,
            };
            match event {
                Event::Command(Some(Command::Register(session))) => {
                    let ttl = session.ttl();
                    self.leases.insert(
                        session.id(),
                        Lease {
                            session,
                            ttl,
                            next_send: crate::support::clock::now(),
                            in_flight: VecDeque::new(),
                        },
                    );
                }
                Event::Command(None | Some(Command::Shutdown)) => break,
                Event::Opened(Ok(stream)) => {
                    if let Some(s) = &mut self.stream {
                        s.state = StreamState::Open(Box::new(stream));
                    }
                }
                Event::Opened(Err(e)) | Event::Message(Err(e)) => {
                    tracing::warn!(error = %e, "lease keep-alive stream failed; reopening");
                    self.reauthenticate |= self.rpc.can_reauthenticate(&e);
                    self.reset_stream();
                }
                Event::Message(Ok(None)) => self.reset_stream(),
                Event::Message(Ok(Some(response))) => self.on_response(response),
                Event::Timer => {}
            }
        }
        for lease in self.leases.values() {
            lease.session.mark_lost(LossReason::ClientClosed);
        }
    }

    /// Drops sessions that ended (closed, orphaned) and declares lost those whose deadline
    /// passed without an acknowledged keep-alive.
    fn expire_and_prune(&mut self) {
        let now = crate::support::clock::now();
        self.leases.retain(|_, lease| {
            if lease.session.loss_reason().is_some() {
                return false;
            }
            if now >= lease.session.deadline() {
                lease.session.mark_lost(LossReason::Expired);
                return false;
            }
            true
        });
        if self.leases.is_empty() {
            // Nothing to renew: close the stream rather than keep an idle one open.
            self.stream = None;
        }
    }

    fn detect_stall(&mut self) {
        let now = crate::support::clock::now();
        let stalled = self.leases.values().any(|lease| {
            lease
                .in_flight
                .front()
                .is_some_and(|sent| now.duration_since(*sent) >= stall_after(lease.ttl))
        });
        if stalled {
            tracing::warn!("lease keep-alive unanswered; reopening the stream");
            self.reset_stream();
        }
    }

    /// Forgets the stream and its unanswered requests; the next attempt goes to the next
    /// endpoint after a backoff that always leaves time before the nearest deadline.
    fn reset_stream(&mut self) {
        if let Some(stream) = self.stream.take() {
            stream.sender.fail_over();
        }
        let now = crate::support::clock::now();
        let mut wait = self.backoff.next_pause();
        for lease in self.leases.values_mut() {
            lease.in_flight.clear();
            lease.next_send = now;
            let remaining = lease.session.deadline().saturating_duration_since(now);
            wait = wait.min(remaining / 2);
        }
        self.retry_at = now + wait;
    }

    fn send_due(&mut self) {
        let now = crate::support::clock::now();
        let due: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.in_flight.is_empty() && l.next_send <= now)
            .map(|(id, _)| *id)
            .collect();
        if due.is_empty() {
            return;
        }
        if self.stream.is_none() {
            if now < self.retry_at {
                return;
            }
            // The first requests are queued before the call is issued (see `keep_alive`).
            let reauthenticate = std::mem::take(&mut self.reauthenticate);
            let (sender, opening) = self.rpc.keep_alive(&due, reauthenticate);
            self.stream = Some(Stream {
                sender,
                state: StreamState::Opening(Box::pin(opening)),
            });
        } else if let Some(stream) = &self.stream {
            for id in &due {
                stream.sender.send(*id);
            }
        }
        for id in due {
            if let Some(lease) = self.leases.get_mut(&id) {
                lease.in_flight.push_back(now);
            }
        }
    }

    fn on_response(&mut self, response: Renewed) {
        self.backoff.reset();
        let Some(lease) = self.leases.get_mut(&response.id) else {
            return;
        };
        let Some(sent) = lease.in_flight.pop_front() else {
            return;
        };
        if response.ttl <= 0 {
            lease.session.mark_lost(LossReason::Revoked);
            self.leases.remove(&response.id);
            return;
        }
        let ttl = Duration::from_secs(response.ttl.unsigned_abs());
        lease.ttl = ttl;
        let deadline = sent + ttl - safety_margin(ttl);
        lease.session.extend(deadline, ttl);
        tracing::trace!(
            lease = %LeaseHex(response.id),
            margin = ?deadline.saturating_duration_since(crate::support::clock::now()),
            "lease renewed"
        );
        lease.next_send = sent + ttl / 3;
    }

    fn next_wake(&self) -> Instant {
        let now = crate::support::clock::now();
        let mut wake = now + Duration::from_secs(3600);
        for lease in self.leases.values() {
            wake = wake.min(lease.session.deadline());
            match lease.in_flight.front() {
                Some(sent) => wake = wake.min(*sent + stall_after(lease.ttl)),
                None if self.stream.is_some() => wake = wake.min(lease.next_send),
                None => wake = wake.min(lease.next_send.max(self.retry_at)),
            }
        }
        wake.max(now)
    }
}

/// Waits for the stream's next event: the call opening, or a response; never ready
/// while there is no stream.
async fn poll_stream(stream: &mut Option<Stream>) -> Event {
    match stream {
        Some(Stream {
            state: StreamState::Opening(opening),
            ..
        }) => Event::Opened(opening.await),
        Some(Stream {
            state: StreamState::Open(open),
            ..
        }) => Event::Message(open.next().await),
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margins_are_bounded() {
        assert_eq!(
            safety_margin(Duration::from_secs(2)),
            Duration::from_millis(200)
        );
        assert_eq!(
            safety_margin(Duration::from_secs(60)),
            Duration::from_secs(1)
        );
        assert_eq!(
            safety_margin(Duration::from_millis(500)),
            Duration::from_millis(100)
        );
        assert!(stall_after(Duration::from_secs(2)) < Duration::from_secs(2) / 2);
    }
}
