//! The watch and compaction parts of the script: creates (from now, from the past, with
//! our ids, duplicated, filtered, with previous values), cancels, events, catch-up and the
//! answers to a watcher whose start was compacted.

use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::{PROGRESS_INTERVAL, QUIET, Script, kv, other, prefix, refused, revision};
use crate::transport::generated::etcdserverpb as pb;
use crate::transport::generated::mvccpb;
use pb::kv_client::KvClient;
use pb::watch_client::WatchClient;
use pb::watch_create_request::FilterType;
use pb::watch_request::RequestUnion;

type Answers = tonic::Streaming<pb::WatchResponse>;

/// A create request for watcher `id` (0: etcd chooses) on `[key, end)` from `start`.
fn create(
    id: i64,
    key: &str,
    end: &[u8],
    start: i64,
    no_put: bool,
    prev_kv: bool,
) -> pb::WatchRequest {
    pb::WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(pb::WatchCreateRequest {
            key: key.into(),
            range_end: end.to_vec(),
            start_revision: start,
            filters: if no_put {
                vec![FilterType::Noput as i32]
            } else {
                Vec::new()
            },
            prev_kv,
            watch_id: id,
            ..Default::default()
        })),
    }
}

fn cancel(id: i64) -> pb::WatchRequest {
    pb::WatchRequest {
        request_union: Some(RequestUnion::CancelRequest(pb::WatchCancelRequest {
            watch_id: id,
        })),
    }
}

fn event(e: &mvccpb::Event) -> String {
    let kind = if e.r#type == mvccpb::event::EventType::Delete as i32 {
        "DELETE"
    } else {
        "PUT"
    };
    let now = e.kv.as_ref().map(kv).unwrap_or_default();
    match &e.prev_kv {
        Some(prev) => format!("{kind} {now} (prev {})", kv(prev)),
        None => format!("{kind} {now}"),
    }
}

impl Script {
    /// Every answer until the stream is quiet, ordered by revision and watch id (etcd sends
    /// one revision's answers to several watchers in no set order).
    async fn answers(&mut self, what: &str, answers: &mut Answers) -> std::io::Result<()> {
        let mut got = Vec::new();
        while let Ok(answer) = tokio::time::timeout(QUIET, answers.message()).await {
            match answer.map_err(other)? {
                Some(answer) => got.push(answer),
                None => break,
            }
        }
        // etcd sends one revision's events to several watchers in no set order: within a
        // run of answers with events at one revision, order by watch id; the rest stays
        // in the order it came.
        let mut start = 0;
        while start < got.len() {
            let key = |a: &pb::WatchResponse| (!a.events.is_empty()).then(|| revision(&a.header));
            let run = got[start..]
                .iter()
                .take_while(|a| key(a).is_some() && key(a) == key(&got[start]))
                .count()
                .max(1);
            got[start..start + run].sort_by_key(|a| a.watch_id);
            start += run;
        }
        if got.is_empty() {
            self.note(format!("watch {what}: nothing"));
        }
        for a in got {
            let events: Vec<String> = a.events.iter().map(event).collect();
            self.note(format!(
                "watch {what}: id {} created {} canceled {} compact {} reason {:?} rev {} {events:?}",
                a.watch_id,
                a.created,
                a.canceled,
                a.compact_revision,
                a.cancel_reason,
                revision(&a.header)
            ));
        }
        Ok(())
    }

    async fn put(&mut self, key: &str) -> std::io::Result<i64> {
        let resp = KvClient::new(self.channel.clone())
            .put(pb::PutRequest {
                key: key.into(),
                value: b"v".to_vec(),
                ..Default::default()
            })
            .await
            .map_err(other)?;
        Ok(revision(&resp.get_ref().header))
    }

    async fn delete(&mut self, key: &str) -> std::io::Result<i64> {
        let resp = KvClient::new(self.channel.clone())
            .delete_range(pb::DeleteRangeRequest {
                key: key.into(),
                ..Default::default()
            })
            .await
            .map_err(other)?;
        Ok(revision(&resp.get_ref().header))
    }

    async fn open(&mut self) -> std::io::Result<(UnboundedSender<pb::WatchRequest>, Answers)> {
        let (send, requests) = unbounded_channel();
        // etcd answers the call's headers with its first message: send one first.
        let _ = send.send(create(1, "unused/", b"unused0", 0, false, false));
        let mut answers = WatchClient::new(self.channel.clone())
            .watch(UnboundedReceiverStream::new(requests))
            .await
            .map_err(other)?
            .into_inner();
        self.answers("open", &mut answers).await?;
        Ok((send, answers))
    }

    pub(super) async fn watch_script(&mut self) -> std::io::Result<()> {
        let (send, mut answers) = self.open().await?;
        let w_end = prefix("w/").range_end;
        let _ = send.send(create(7, "w/", &w_end, 0, false, false));
        self.answers("create 7 on w/ from now", &mut answers)
            .await?;
        let first = self.put("w/1").await?;
        self.answers("put w/1", &mut answers).await?;
        self.put("w/2").await?;
        self.delete("w/1").await?;
        self.answers("put w/2, delete w/1", &mut answers).await?;
        let _ = send.send(create(8, "w/", &w_end, first, false, false));
        self.answers("create 8 on w/ from the first put (catch-up)", &mut answers)
            .await?;
        let _ = send.send(create(7, "x", b"", 0, false, false));
        self.answers("create 7 again", &mut answers).await?;
        let _ = send.send(create(9, "w/2", b"", 0, true, true));
        self.answers(
            "create 9 on w/2, deletes only, previous values",
            &mut answers,
        )
        .await?;
        self.put("w/2").await?;
        self.delete("w/2").await?;
        self.answers("put w/2, delete w/2", &mut answers).await?;
        let _ = send.send(cancel(8));
        self.answers("cancel 8", &mut answers).await?;
        let _ = send.send(cancel(99));
        self.answers("cancel 99 (no such watcher)", &mut answers)
            .await?;
        let _ = send.send(create(0, "w/", &w_end, 0, false, false));
        self.answers("create with an id etcd chooses", &mut answers)
            .await?;
        let _ = send.send(create(10, "w/b", b"w/a", 0, false, false));
        self.answers("create on an empty range", &mut answers)
            .await?;
        let _ = send.send(create(11, "", &[0], 0, false, false));
        self.answers("create on every key", &mut answers).await?;
        self.put("w/3").await?;
        self.answers("put w/3", &mut answers).await?;
        Ok(())
    }

    /// Timed progress notifications (the server sends them every [`PROGRESS_INTERVAL`]):
    /// a quiet watcher that asked for them gets an answer with no events, its header the
    /// store's revision; events come as before.
    pub(super) async fn progress_script(&mut self) -> std::io::Result<()> {
        let (send, mut answers) = self.open().await?;
        let p_end = prefix("p/").range_end;
        let mut with_progress = create(30, "p/", &p_end, 0, false, false);
        if let Some(RequestUnion::CreateRequest(create)) = &mut with_progress.request_union {
            create.progress_notify = true;
        }
        let _ = send.send(with_progress);
        // Exactly one answer (a notification may follow it at any moment).
        let line = match tokio::time::timeout(QUIET * 4, answers.message()).await {
            Ok(Ok(Some(a))) => format!("id {} created {}", a.watch_id, a.created),
            Ok(Ok(None)) => "the stream ended".into(),
            Ok(Err(status)) => refused(&status),
            Err(_) => "nothing".into(),
        };
        self.note(format!(
            "create 30 on p/ with progress notifications: {line}"
        ));
        let outside = self.put("q/1").await?;
        // Notifications come on the server's ticker: read until one has the write's
        // revision. None of them has events.
        let wait = PROGRESS_INTERVAL * 4;
        let deadline = tokio::time::Instant::now() + wait;
        let mut events = 0;
        let line = loop {
            match tokio::time::timeout_at(deadline, answers.message()).await {
                Ok(Ok(Some(a))) => {
                    events += a.events.len();
                    if revision(&a.header) >= outside {
                        break format!(
                            "id {} created {} events so far {events} rev is the last write's {}",
                            a.watch_id,
                            a.created,
                            revision(&a.header) == outside
                        );
                    }
                }
                Ok(Ok(None)) => break "the stream ended".into(),
                Ok(Err(status)) => break refused(&status),
                Err(_) => break format!("nothing within {wait:?}"),
            }
        };
        self.note(format!("progress after a write outside p/: {line}"));
        self.put("p/1").await?;
        let line = match tokio::time::timeout(wait, answers.message()).await {
            Ok(Ok(Some(a))) => {
                let events: Vec<String> = a.events.iter().map(event).collect();
                format!("id {} {events:?}", a.watch_id)
            }
            Ok(Ok(None)) => "the stream ended".into(),
            Ok(Err(status)) => refused(&status),
            Err(_) => format!("nothing within {wait:?}"),
        };
        self.note(format!("put p/1: {line}"));
        Ok(())
    }

    pub(super) async fn compaction_script(&mut self) -> std::io::Result<()> {
        let before = self.put("c/1").await?;
        let at = self.put("c/2").await?;
        self.delete("c/1").await?;
        self.put("c/3").await?;
        let mut kv_client = KvClient::new(self.channel.clone());
        for (what, rev) in [
            ("compact", at),
            ("compact again", at),
            ("compact the future", 1000),
        ] {
            let line = match kv_client
                .compact(pb::CompactionRequest {
                    revision: rev,
                    physical: true,
                })
                .await
            {
                Ok(resp) => format!("rev {}", revision(&resp.get_ref().header)),
                Err(status) => refused(&status),
            };
            self.note(format!("{what}: {line}"));
        }
        self.range(
            "before the compact revision",
            pb::RangeRequest {
                revision: before,
                ..prefix("c/")
            },
        )
        .await;
        self.range(
            "at the compact revision",
            pb::RangeRequest {
                revision: at,
                ..prefix("c/")
            },
        )
        .await;
        let (send, mut answers) = self.open().await?;
        let c_end = prefix("c/").range_end;
        let _ = send.send(create(20, "c/", &c_end, before, false, false));
        self.answers("create 20 from before the compact revision", &mut answers)
            .await?;
        let _ = send.send(create(21, "c/", &c_end, at, false, false));
        self.answers("create 21 from the compact revision", &mut answers)
            .await?;
        self.put("c/4").await?;
        self.answers("put c/4", &mut answers).await?;
        // A compact revision that is a delete, and a watcher that starts there: etcd
        // before 3.4.34 and 3.5.15 loses that delete (etcd #18089).
        self.put("c/5").await?;
        let deleted = self.delete("c/5").await?;
        let line = match kv_client
            .compact(pb::CompactionRequest {
                revision: deleted,
                physical: true,
            })
            .await
        {
            Ok(resp) => format!("rev {}", revision(&resp.get_ref().header)),
            Err(status) => refused(&status),
        };
        self.note(format!("compact at a delete: {line}"));
        let _ = send.send(create(22, "c/", &c_end, deleted, false, false));
        self.answers(
            "create 22 from a compact revision that is a delete",
            &mut answers,
        )
        .await?;
        Ok(())
    }
}
