//! Internal watch streams: open a stream carrying one or more watchers, wait until etcd
//! confirms each, then read responses.
//!
//! Waiters watch from "now" (`start_revision = 0`). etcd serves such a watcher as *synced*,
//! so events arrive as they happen; a watcher started at a past or current revision is
//! *unsynced* and served by a loop that runs every 100 ms, which is what caps etcd's own Go
//! lock recipe at about 80 handoffs per second.

use std::collections::VecDeque;

use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

use super::Rpc;
use super::generated::{etcdserverpb as pb, mvccpb};
use super::watch_ids::WatchIds;
use crate::support::error::operation::Operation;
use crate::support::error::{Error, Result};
use crate::support::etcd_text;
use crate::support::kv::KeyValue;

/// Which events a watcher reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Only {
    All,
    Deletes,
    Puts,
}

/// A watcher on one key (or a range, with `range_end`) from `start_revision` (0 = from now).
#[derive(Debug, Clone)]
pub(crate) struct Watch {
    pub(crate) key: Vec<u8>,
    pub(crate) range_end: Vec<u8>,
    pub(crate) start_revision: i64,
    pub(crate) only: Only,
    /// The watch id to give it on its stream (etcd 3.4+), or 0 for one etcd chooses. A
    /// stream whose watchers all have our ids never sees an id etcd chose.
    pub(crate) id: i64,
    /// Ask for etcd's timed progress notifications: a response with no events whose header
    /// revision is the store's, sent to a synced watcher that had no event for a while
    /// (`--experimental-watch-progress-notify-interval`, 10 minutes by default). It goes
    /// through the same channel as the watcher's events, so every event up to that
    /// revision came before it.
    pub(crate) progress_notify: bool,
}

impl Watch {
    /// One key (the raw watch of `testing` uses it; the client's own watchers are built
    /// by `transport/watches/`).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn key(key: &[u8], start_revision: i64, only: Only) -> Watch {
        Watch {
            key: key.to_vec(),
            range_end: Vec::new(),
            start_revision,
            only,
            id: 0,
            progress_notify: false,
        }
    }

    fn to_pb(&self) -> pb::WatchCreateRequest {
        use pb::watch_create_request::FilterType;
        pb::WatchCreateRequest {
            key: self.key.clone(),
            range_end: self.range_end.clone(),
            start_revision: self.start_revision,
            filters: match self.only {
                Only::All => Vec::new(),
                Only::Deletes => vec![FilterType::Noput as i32],
                Only::Puts => vec![FilterType::Nodelete as i32],
            },
            watch_id: self.id,
            progress_notify: self.progress_notify,
            ..Default::default()
        }
    }
}

/// What happened to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    Put,
    Delete,
}

/// One change; for a delete, `kv` has the key and the deleting revision as `mod_revision`.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) kind: EventKind,
    pub(crate) kv: KeyValue,
}

/// One message from etcd on a watch stream.
#[derive(Debug, Clone, Default)]
pub(crate) struct WatchResponse {
    pub(crate) watch_id: i64,
    pub(crate) created: bool,
    pub(crate) canceled: bool,
    /// The header revision: the store revision when etcd sent it (for events a synced
    /// watcher gets as they happen, and for a progress notification), or when it read the
    /// batch (for a watcher catching up: not every event up to it was sent yet).
    pub(crate) revision: i64,
    pub(crate) compact_revision: i64,
    pub(crate) cancel_reason: String,
    pub(crate) events: Vec<Event>,
}

impl From<pb::WatchResponse> for WatchResponse {
    fn from(r: pb::WatchResponse) -> Self {
        WatchResponse {
            watch_id: r.watch_id,
            created: r.created,
            canceled: r.canceled,
            revision: r.header.map_or(0, |h| h.revision),
            compact_revision: r.compact_revision,
            cancel_reason: r.cancel_reason,
            events: r
                .events
                .into_iter()
                .filter_map(|e| {
                    let kind = if e.r#type == mvccpb::event::EventType::Delete as i32 {
                        EventKind::Delete
                    } else {
                        EventKind::Put
                    };
                    Some(Event {
                        kind,
                        kv: e.kv?.into(),
                    })
                })
                .collect(),
        }
    }
}

/// One bidirectional watch stream. Dropping it cancels its watchers (the HTTP/2 stream is
/// reset).
pub(crate) struct WatchStream {
    // Also keeps the request side open: closing it would half-close the stream.
    requests: UnboundedSender<pb::WatchRequest>,
    stream: tonic::Streaming<pb::WatchResponse>,
    /// Responses that arrived while we were still waiting for `created` confirmations.
    early: VecDeque<WatchResponse>,
    /// The endpoint this stream runs on.
    endpoint: usize,
    /// Its URL, for errors.
    url: String,
    /// The server's ids for our watchers (see `watch_ids.rs`: etcd's gRPC proxy numbers
    /// them itself).
    ids: std::sync::Mutex<WatchIds>,
}

/// What `open` learned: one watch id per create request, in order (`None` where etcd
/// refused the watcher: only [`WatchStream::open_tolerant`] returns those), and the lowest
/// store revision etcd reported when creating them (its "now" for the first watcher).
pub(crate) struct Created {
    pub(crate) ids: Vec<Option<i64>>,
    pub(crate) revision: i64,
    /// etcd's answer to each create request, in order: its header revision is etcd's
    /// "now" for that watcher (it reports every event after it), and a refusal says why.
    pub(crate) answers: Vec<WatchResponse>,
    /// The member the stream runs on has etcd #18089's fix (its Status said so just
    /// before the stream opened): a watcher may resume right after the last revision it
    /// covers, not at it (see `watches/watcher.rs`).
    pub(crate) keeps_compacted_deletes: bool,
}

impl WatchStream {
    /// Opens a stream with all `creates` queued and returns once etcd confirmed each of
    /// them. On a transient failure the client moves on to its next endpoint.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) async fn open(rpc: &Rpc, creates: Vec<Watch>) -> Result<(WatchStream, Created)> {
        let (watch, created, refusal) = Self::open_tolerant(rpc, |_| creates.clone()).await?;
        match refusal {
            Some(refusal) => Err(cancel_error(&refusal)),
            None => Ok((watch, created)),
        }
    }

    /// Like [`open`](WatchStream::open), but a watcher etcd refuses (a compacted start
    /// revision) is reported as a `None` id with the first refusal, not as an error. The
    /// create requests are made once the member is known: `creates(true)` on a member with
    /// etcd #18089's fix ([`Created::keeps_compacted_deletes`]).
    pub(crate) async fn open_tolerant(
        rpc: &Rpc,
        creates: impl Fn(bool) -> Vec<Watch>,
    ) -> Result<(WatchStream, Created, Option<WatchResponse>)> {
        rpc.with_fresh_token(|| Self::open_with_token(rpc, &creates))
            .await
    }

    async fn open_with_token(
        rpc: &Rpc,
        creates: &impl Fn(bool) -> Vec<Watch>,
    ) -> Result<(WatchStream, Created, Option<WatchResponse>)> {
        if rpc.is_dead() {
            return Err(Error::Closed);
        }
        let (endpoint, channel) = rpc.channel();
        let result = tokio::time::timeout(rpc.request_timeout(), async {
            // Asked on every open, not remembered: a member restarted with another
            // release (a rolling upgrade, or a downgrade) breaks the stream, and the next
            // one asks again.
            let fixed = rpc.member_keeps_compacted_deletes(channel.clone()).await;
            let (watch, mut created, refusal) =
                Self::open_on(rpc, endpoint, channel, creates(fixed)).await?;
            created.keeps_compacted_deletes = fixed;
            Ok((watch, created, refusal))
        })
        .await
        .unwrap_or_else(|_| {
            Err(Error::Timeout {
                operation: Operation::OpenWatch,
                after: rpc.request_timeout(),
                endpoint: Some(rpc.endpoint_url(endpoint).to_string()),
            })
        });
        if let Err(e) = &result
            && e.is_transient()
        {
            rpc.fail_over(endpoint);
        }
        result
    }

    async fn open_on(
        rpc: &Rpc,
        endpoint: usize,
        channel: super::Channel,
        creates: Vec<Watch>,
    ) -> Result<(WatchStream, Created, Option<WatchResponse>)> {
        let wanted = creates.len();
        let (requests, receiver) = unbounded_channel();
        let mut ids = WatchIds::default();
        // Queue before issuing the call: etcd sends headers only with its first response.
        for create in creates {
            ids.sent_create(create.id);
            let _ = requests.send(pb::WatchRequest {
                request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                    create.to_pb(),
                )),
            });
        }
        let stream = rpc.watch(endpoint, channel, receiver).await?;
        let mut watch = WatchStream {
            requests,
            stream,
            early: VecDeque::new(),
            endpoint,
            url: rpc.endpoint_url(endpoint).to_string(),
            ids: std::sync::Mutex::new(ids),
        };
        let mut created = Created {
            ids: Vec::with_capacity(wanted),
            revision: 0,
            answers: Vec::with_capacity(wanted),
            keeps_compacted_deletes: false,
        };
        let mut refusal = None;
        while created.ids.len() < wanted {
            let response = watch.receive().await?;
            if response.created {
                if response.canceled {
                    // An expired token must be refreshed by the caller: not tolerated.
                    let error = cancel_error(&response);
                    if rpc.can_reauthenticate(&error) {
                        return Err(error);
                    }
                    created.ids.push(None);
                    created.answers.push(response.clone());
                    refusal.get_or_insert(response);
                    continue;
                }
                created.ids.push(Some(response.watch_id));
                let revision = response.revision;
                created.answers.push(response);
                created.revision = if created.revision == 0 {
                    revision
                } else {
                    created.revision.min(revision)
                };
            } else {
                watch.early.push_back(response);
            }
        }
        Ok((watch, created, refusal))
    }

    /// Adds a watcher to the open stream; its `created` answer arrives in order with the
    /// other responses.
    pub(crate) fn send_create(&self, create: &Watch) -> Result<()> {
        let mut ids = self.ids();
        self.send(pb::watch_request::RequestUnion::CreateRequest(
            create.to_pb(),
        ))?;
        ids.sent_create(create.id);
        Ok(())
    }

    /// Cancels watcher `id` (ours) on this stream.
    pub(crate) fn send_cancel(&self, id: i64) -> Result<()> {
        let theirs = self.ids().cancel_ids(id);
        for watch_id in theirs {
            self.send(pb::watch_request::RequestUnion::CancelRequest(
                pb::WatchCancelRequest { watch_id },
            ))?;
        }
        Ok(())
    }

    /// Whether the server numbers the watchers itself (etcd's gRPC proxy does), once its
    /// first answer said.
    pub(crate) fn server_numbers_watchers(&self) -> bool {
        self.ids().server_numbers() == Some(true)
    }

    fn ids(&self) -> std::sync::MutexGuard<'_, WatchIds> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, request: pb::watch_request::RequestUnion) -> Result<()> {
        self.requests
            .send(pb::WatchRequest {
                request_union: Some(request),
            })
            .map_err(|_| self.unavailable("the watch stream is closed"))
    }

    async fn receive(&mut self) -> Result<WatchResponse> {
        match self.stream.message().await {
            Ok(Some(response)) => {
                let mut response = WatchResponse::from(response);
                self.ids()
                    .translate(response.created, response.canceled, &mut response.watch_id);
                Ok(response)
            }
            Ok(None) => Err(self.unavailable("etcd closed the watch stream")),
            Err(status) => Err(super::fault::status_error(&status, &self.url)),
        }
    }

    fn unavailable(&self, reason: &str) -> Error {
        Error::Unavailable {
            endpoint: Some(self.url.clone()),
            reason: reason.to_string(),
            source: None,
        }
    }

    /// Whether the client has moved to another endpoint since this stream was opened
    /// (because requests or the keep-alive stream found this one dead or frozen): a frozen
    /// member sends no events and no error, so watchers follow the client instead.
    pub(crate) fn is_stale(&self, rpc: &Rpc) -> bool {
        rpc.current() != self.endpoint
    }

    /// The next response (events, or a cancellation the caller must handle).
    pub(crate) async fn next(&mut self) -> Result<WatchResponse> {
        if let Some(early) = self.early.pop_front() {
            return Ok(early);
        }
        self.receive().await
    }
}

/// The error for a watcher etcd refused or cancelled.
pub(crate) fn cancel_error(response: &WatchResponse) -> Error {
    if response.compact_revision > 0 {
        return Error::Server {
            code: crate::support::error::code::Code::OutOfRange,
            message: format!(
                "watch start revision was compacted (compacted up to {})",
                response.compact_revision
            ),
        };
    }
    let reason = if response.cancel_reason.is_empty() {
        "etcd cancelled the watch".to_string()
    } else {
        response.cancel_reason.clone()
    };
    if etcd_text::is_stale_token(&reason) {
        return Error::Server {
            code: crate::support::error::code::Code::Unauthenticated,
            message: reason,
        };
    }
    if reason.contains(etcd_text::PERMISSION_DENIED) || reason.contains("auth") {
        return Error::Server {
            code: crate::support::error::code::Code::PermissionDenied,
            message: reason,
        };
    }
    Error::unavailable(reason)
}
