//! The scripted requests of the differential test (`tests/sim_fidelity.rs`): every kind of
//! request and answer the crate relies on, sent over raw gRPC to one endpoint (a real etcd
//! or a simulated member), written down as a transcript whose lines do not depend on which
//! server answered (no cluster or member ids, terms, lease ids or remaining seconds), so
//! that two transcripts can be compared line by line.

use std::collections::HashMap;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::transport::generated::etcdserverpb as pb;
use crate::transport::generated::mvccpb;
use pb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::maintenance_client::MaintenanceClient;
use pb::range_request::{SortOrder, SortTarget};
use pb::request_op::Request as Op;

/// How long a watch stream must stay silent for its answers so far to be written down.
const QUIET: Duration = Duration::from_millis(250);

/// How often the server the [`transcript`] runs against must send watch progress
/// notifications (a real etcd: `watch_progress_notify_interval`; a simulated one:
/// `set_progress_interval`).
///
/// ```
/// assert!(etcd_sync::testing::sim::PROGRESS_INTERVAL.as_millis() > 0);
/// ```
pub const PROGRESS_INTERVAL: Duration = Duration::from_millis(300);

/// Runs the script against `endpoint` (a fresh server: the transcript names revisions as
/// they are) and returns its transcript.
///
/// # Errors
///
/// The endpoint could not be reached, or a stream broke.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cluster = etcd_sync::testing::sim::SimCluster::start(1)?;
/// let lines = etcd_sync::testing::sim::transcript(&cluster.endpoints()[0])?;
/// assert!(!lines.is_empty());
/// # Ok(()) }
/// ```
pub fn transcript(endpoint: &str) -> std::io::Result<Vec<String>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let endpoint = Endpoint::from_shared(endpoint.to_string()).map_err(other)?;
        let channel = if crate::transport::memory::is_memory(&endpoint.uri().to_string()) {
            endpoint
                .connect_with_connector(crate::transport::memory::Connector)
                .await
        } else {
            endpoint.connect().await
        }
        .map_err(other)?;
        let mut script = Script {
            channel,
            lines: Vec::new(),
            leases: HashMap::new(),
        };
        script.run().await?;
        Ok(script.lines)
    })
}

fn other(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

struct Script {
    channel: Channel,
    lines: Vec<String>,
    /// Lease ids by order of appearance (L1, L2, ...): servers choose different ones.
    leases: HashMap<i64, usize>,
}

fn put(key: &str, value: &str, lease: i64) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(Op::RequestPut(pb::PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
            ..Default::default()
        })),
    }
}

fn range_op(range: pb::RangeRequest) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(Op::RequestRange(range)),
    }
}

fn prefix(p: &str) -> pb::RangeRequest {
    let mut end = p.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    pb::RangeRequest {
        key: p.into(),
        range_end: end,
        ..Default::default()
    }
}

fn compare(
    key: &str,
    target: CompareTarget,
    result: CompareResult,
    operand: TargetUnion,
) -> pb::Compare {
    pb::Compare {
        key: key.into(),
        target: target as i32,
        result: result as i32,
        target_union: Some(operand),
        ..Default::default()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn kv(kv: &mvccpb::KeyValue) -> String {
    format!(
        "{}={}@c{}m{}v{}",
        text(&kv.key),
        text(&kv.value),
        kv.create_revision,
        kv.mod_revision,
        kv.version
    )
}

fn refused(status: &tonic::Status) -> String {
    format!("refused {:?}: {}", status.code(), status.message())
}

fn revision(header: &Option<pb::ResponseHeader>) -> i64 {
    header.as_ref().map_or(0, |h| h.revision)
}

impl Script {
    fn note(&mut self, line: String) {
        self.lines.push(line);
    }

    fn lease(&mut self, id: i64) -> String {
        if id == 0 {
            return "none".into();
        }
        let next = self.leases.len() + 1;
        format!("L{}", self.leases.entry(id).or_insert(next))
    }

    fn kv(&mut self, kv_: &mvccpb::KeyValue) -> String {
        let lease = self.lease(kv_.lease);
        format!("{} lease {lease}", kv(kv_))
    }

    fn range_answer(&mut self, resp: &pb::RangeResponse) -> String {
        let kvs: Vec<String> = resp.kvs.iter().map(|k| self.kv(k)).collect();
        format!(
            "rev {} count {} more {} [{}]",
            revision(&resp.header),
            resp.count,
            resp.more,
            kvs.join(", ")
        )
    }

    async fn range(&mut self, what: &str, req: pb::RangeRequest) {
        let line = match KvClient::new(self.channel.clone()).range(req).await {
            Ok(resp) => self.range_answer(resp.get_ref()),
            Err(status) => refused(&status),
        };
        self.note(format!("range {what}: {line}"));
    }

    async fn txn(&mut self, what: &str, req: pb::TxnRequest) {
        let line = match KvClient::new(self.channel.clone()).txn(req).await {
            Ok(resp) => {
                let resp = resp.into_inner();
                let answers: Vec<String> = resp
                    .responses
                    .iter()
                    .map(|r| match &r.response {
                        Some(pb::response_op::Response::ResponseRange(range)) => {
                            format!("range({})", self.range_answer(range))
                        }
                        Some(pb::response_op::Response::ResponsePut(put)) => {
                            format!("put(rev {})", revision(&put.header))
                        }
                        Some(pb::response_op::Response::ResponseDeleteRange(d)) => {
                            format!("delete(rev {} deleted {})", revision(&d.header), d.deleted)
                        }
                        Some(pb::response_op::Response::ResponseTxn(t)) => {
                            format!("txn(rev {} succeeded {})", revision(&t.header), t.succeeded)
                        }
                        None => "none".into(),
                    })
                    .collect();
                format!(
                    "rev {} succeeded {} {}",
                    revision(&resp.header),
                    resp.succeeded,
                    answers.join(" ")
                )
            }
            Err(status) => refused(&status),
        };
        self.note(format!("txn {what}: {line}"));
    }

    async fn run(&mut self) -> std::io::Result<()> {
        self.kv_script().await;
        self.lease_script().await?;
        self.watch_script().await?;
        self.progress_script().await?;
        self.compaction_script().await?;
        let status = MaintenanceClient::new(self.channel.clone())
            .status(pb::StatusRequest {})
            .await
            .map_err(other)?
            .into_inner();
        self.note(format!(
            "status: learner {} leader known {} rev {}",
            status.is_learner,
            status.leader != 0,
            revision(&status.header)
        ));
        Ok(())
    }

    async fn kv_script(&mut self) {
        let mut kv_client = KvClient::new(self.channel.clone());
        for (key, value) in [("p/c", "3"), ("p/a", "1"), ("p/b", "2"), ("p/a", "11")] {
            let line = match kv_client
                .put(pb::PutRequest {
                    key: key.into(),
                    value: value.into(),
                    prev_kv: true,
                    ..Default::default()
                })
                .await
            {
                Ok(resp) => {
                    let prev = resp.get_ref().prev_kv.as_ref().map(kv);
                    format!("rev {} prev {prev:?}", revision(&resp.get_ref().header))
                }
                Err(status) => refused(&status),
            };
            self.note(format!("put {key}={value}: {line}"));
        }
        self.range(
            "one key",
            pb::RangeRequest {
                key: b"p/a".to_vec(),
                ..Default::default()
            },
        )
        .await;
        self.range(
            "missing key",
            pb::RangeRequest {
                key: b"p/zz".to_vec(),
                ..Default::default()
            },
        )
        .await;
        self.range("prefix", prefix("p/")).await;
        self.range(
            "newest 2 by create, keys only",
            pb::RangeRequest {
                limit: 2,
                sort_target: SortTarget::Create as i32,
                sort_order: SortOrder::Descend as i32,
                keys_only: true,
                ..prefix("p/")
            },
        )
        .await;
        self.range(
            "first created (Go's owner read)",
            pb::RangeRequest {
                limit: 1,
                sort_target: SortTarget::Create as i32,
                sort_order: SortOrder::Ascend as i32,
                ..prefix("p/")
            },
        )
        .await;
        self.range(
            "created up to 3, newest first",
            pb::RangeRequest {
                sort_target: SortTarget::Create as i32,
                sort_order: SortOrder::Descend as i32,
                max_create_revision: 3,
                ..prefix("p/")
            },
        )
        .await;
        self.range(
            "unsorted limit 1",
            pb::RangeRequest {
                limit: 1,
                ..prefix("p/")
            },
        )
        .await;
        self.range(
            "count only",
            pb::RangeRequest {
                count_only: true,
                ..prefix("p/")
            },
        )
        .await;
        self.range(
            "at revision 3",
            pb::RangeRequest {
                revision: 3,
                ..prefix("p/")
            },
        )
        .await;
        self.range(
            "every key from p/b",
            pb::RangeRequest {
                key: b"p/b".to_vec(),
                range_end: vec![0],
                ..Default::default()
            },
        )
        .await;
        self.range(
            "at a future revision",
            pb::RangeRequest {
                revision: 1000,
                ..prefix("p/")
            },
        )
        .await;
        // Go's tryAcquire shape, twice: the second finds the key.
        let acquire = pb::TxnRequest {
            compare: vec![compare(
                "q/k",
                CompareTarget::Create,
                CompareResult::Equal,
                TargetUnion::CreateRevision(0),
            )],
            success: vec![put("q/k", "", 0), range_op(prefix("q/"))],
            failure: vec![range_op(pb::RangeRequest {
                key: b"q/k".to_vec(),
                ..Default::default()
            })],
        };
        self.txn("put if absent", acquire.clone()).await;
        self.txn("put if absent again", acquire).await;
        self.txn(
            "value compare on a missing key",
            pb::TxnRequest {
                compare: vec![compare(
                    "q/missing",
                    CompareTarget::Value,
                    CompareResult::NotEqual,
                    TargetUnion::Value(b"x".to_vec()),
                )],
                success: vec![put("q/never", "", 0)],
                ..Default::default()
            },
        )
        .await;
        self.txn(
            "version compare on a missing key",
            pb::TxnRequest {
                compare: vec![compare(
                    "q/missing",
                    CompareTarget::Version,
                    CompareResult::Equal,
                    TargetUnion::Version(0),
                )],
                success: vec![range_op(prefix("q/"))],
                ..Default::default()
            },
        )
        .await;
        self.txn(
            "mod revision compare over a range",
            pb::TxnRequest {
                compare: vec![pb::Compare {
                    range_end: b"p0".to_vec(),
                    ..compare(
                        "p/",
                        CompareTarget::Mod,
                        CompareResult::Greater,
                        TargetUnion::ModRevision(1),
                    )
                }],
                success: vec![pb::RequestOp {
                    request: Some(Op::RequestTxn(pb::TxnRequest {
                        compare: vec![compare(
                            "q/k",
                            CompareTarget::Create,
                            CompareResult::Equal,
                            TargetUnion::CreateRevision(0),
                        )],
                        success: vec![put("q/nested", "", 0)],
                        failure: vec![put("q/nested-else", "", 0)],
                    })),
                }],
                ..Default::default()
            },
        )
        .await;
        self.txn(
            "a key put twice",
            pb::TxnRequest {
                success: vec![put("q/d", "1", 0), put("q/d", "2", 0)],
                ..Default::default()
            },
        )
        .await;
        self.txn(
            "a put with a lease that does not exist",
            pb::TxnRequest {
                success: vec![put("q/l", "", 0x1234)],
                ..Default::default()
            },
        )
        .await;
        self.txn(
            "a delete of nothing",
            pb::TxnRequest {
                success: vec![pb::RequestOp {
                    request: Some(Op::RequestDeleteRange(pb::DeleteRangeRequest {
                        key: b"q/none".to_vec(),
                        ..Default::default()
                    })),
                }],
                ..Default::default()
            },
        )
        .await;
        let line = match kv_client
            .delete_range(pb::DeleteRangeRequest {
                prev_kv: true,
                ..delete_prefix("q/")
            })
            .await
        {
            Ok(resp) => {
                let resp = resp.into_inner();
                let prev: Vec<String> = resp.prev_kvs.iter().map(kv).collect();
                format!(
                    "rev {} deleted {} {prev:?}",
                    revision(&resp.header),
                    resp.deleted
                )
            }
            Err(status) => refused(&status),
        };
        self.note(format!("delete q/: {line}"));
    }

    async fn lease_script(&mut self) -> std::io::Result<()> {
        let mut leases = LeaseClient::new(self.channel.clone());
        let granted = leases
            .lease_grant(pb::LeaseGrantRequest { ttl: 30, id: 0 })
            .await
            .map_err(other)?
            .into_inner();
        let id = granted.id;
        let name = self.lease(id);
        self.note(format!(
            "grant: {name} ttl {} rev {}",
            granted.ttl,
            revision(&granted.header)
        ));
        let again = leases
            .lease_grant(pb::LeaseGrantRequest { ttl: 30, id })
            .await;
        let line = match again {
            Ok(_) => "granted".to_string(),
            Err(status) => refused(&status),
        };
        self.note(format!("grant the same id: {line}"));
        for key in ["l/b", "l/a"] {
            self.txn(
                &format!("put {key} with the lease"),
                pb::TxnRequest {
                    success: vec![put(key, "v", id)],
                    ..Default::default()
                },
            )
            .await;
        }
        let live = leases
            .lease_time_to_live(pb::LeaseTimeToLiveRequest { id, keys: true })
            .await
            .map_err(other)?
            .into_inner();
        // etcd lists a lease's keys in no set order.
        let mut keys: Vec<String> = live.keys.iter().map(|k| text(k)).collect();
        keys.sort();
        self.note(format!(
            "time to live: granted {} left>0 {} keys {keys:?}",
            live.granted_ttl,
            live.ttl > 0
        ));
        // Keep-alive: the live lease, then one that does not exist.
        let (send, requests) = tokio::sync::mpsc::unbounded_channel();
        let _ = send.send(pb::LeaseKeepAliveRequest { id });
        let _ = send.send(pb::LeaseKeepAliveRequest { id: 0x777 });
        let mut answers = leases
            .lease_keep_alive(tokio_stream::wrappers::UnboundedReceiverStream::new(
                requests,
            ))
            .await
            .map_err(other)?
            .into_inner();
        for _ in 0..2 {
            let answer = answers.message().await.map_err(other)?.unwrap_or_default();
            let name = if answer.id == id {
                name.clone()
            } else {
                format!("{:#x}", answer.id)
            };
            self.note(format!("keep-alive: {name} ttl {}", answer.ttl));
        }
        drop(send);
        let revoked = leases
            .lease_revoke(pb::LeaseRevokeRequest { id })
            .await
            .map_err(other)?;
        self.note(format!(
            "revoke: rev {}",
            revision(&revoked.get_ref().header)
        ));
        self.range("the lease's keys after revoke", prefix("l/"))
            .await;
        let line = match leases.lease_revoke(pb::LeaseRevokeRequest { id }).await {
            Ok(_) => "revoked".to_string(),
            Err(status) => refused(&status),
        };
        self.note(format!("revoke again: {line}"));
        let gone = leases
            .lease_time_to_live(pb::LeaseTimeToLiveRequest { id, keys: true })
            .await
            .map_err(other)?
            .into_inner();
        self.note(format!(
            "time to live of a revoked lease: ttl {} granted {}",
            gone.ttl, gone.granted_ttl
        ));
        Ok(())
    }
}

fn delete_prefix(p: &str) -> pb::DeleteRangeRequest {
    let range = prefix(p);
    pb::DeleteRangeRequest {
        key: range.key,
        range_end: range.range_end,
        ..Default::default()
    }
}

mod watch;
