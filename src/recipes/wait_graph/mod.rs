//! Who waits for whom under a prefix, across processes: one linearizable Range of the
//! prefix, split into the lines of the names in it by the rule `status()` applies
//! ([`names::split`](crate::line::names::split)), one LeaseTimeToLive per distinct lease ([`lease_ttls`]), then the
//! sessions that can never go on and the cycles among them (`line/cycles.rs`).

pub(crate) mod graph;

use std::collections::{BTreeMap, HashMap};

use crate::client::Client;
use crate::line::cycles;
use crate::line::names::{self, lines};
use crate::line::queue::MAX_NAME_LEN;
use crate::recipes::holder::{Holder, KeyMode, Status};
use crate::recipes::status::{LeaseTtl, lease_ttls};
use crate::support::error::cycle::{Cycle, CycleStep};
use crate::support::error::{Error, Result};
use crate::support::kv::KeyValue;
use graph::{Participant, Place, WaitGraph};

impl Client {
    /// Which session (lease) holds which names under `prefix` and which names it waits
    /// for, with identities, places in line and lease TTLs, and the cycles among the waits
    /// (a cross-process deadlock: one session holds x and waits for y, another holds y and
    /// waits for x). Needs no session.
    ///
    /// One linearizable read of every key under `prefix` (`""`: the whole keyspace), then
    /// one lease lookup per distinct lease, as [`status`](Client::status) does for one
    /// name. A name is in the graph when a lock key (`<name>/<lease hex>[suffix]`: a lock,
    /// reader, permit or candidate) lies under `prefix` and `<name>/` starts with
    /// `prefix`, so that its whole line was read; its holders are decided by the rule
    /// every waiter applies. Release requests (`<name>.revoke/`) are no names.
    ///
    /// What a [`Cycle`] means, and what the graph says about how long each waits (etcd
    /// keeps no times, only create revisions): [`WaitGraph`].
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: `prefix` is longer than 4096 bytes.
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: no endpoint answered (the read and
    ///   lookups are retried on every endpoint first).
    /// * [`Error::Server`]: etcd refused a request (e.g. `PermissionDenied`), or the read's
    ///   answer was larger than the 4 MiB the client takes (gRPC's default; read
    ///   narrower prefixes);
    ///   [`Error::Authentication`]: re-authenticating after an expired token failed.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// let graph = client.wait_graph("jobs/")?;
    /// for cycle in &graph.cycles {
    ///     eprintln!("deadlock: {cycle}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn wait_graph(&self, prefix: impl AsRef<[u8]>) -> Result<WaitGraph> {
        let prefix = prefix.as_ref().to_vec();
        if prefix.len() > MAX_NAME_LEN {
            return Err(Error::InvalidArgument(format!(
                "prefix is {} bytes; at most {MAX_NAME_LEN} are allowed",
                prefix.len()
            )));
        }
        let rpc = self.rpc().clone();
        self.block_on(async move {
            let read = rpc.read(&names::read_of(&prefix)).await?;
            let lines = lines(&prefix, read.kvs);
            let leases: Vec<i64> = lines
                .iter()
                .flat_map(|(_, kvs, _)| kvs.iter().map(|kv| kv.lease))
                .collect();
            let ttls = lease_ttls(&rpc, leases).await?;
            Ok(build(prefix, read.revision, lines, &ttls))
        })
    }
}

/// The graph of `lines`, read at `revision`, with the leases' TTLs.
fn build(
    prefix: Vec<u8>,
    revision: i64,
    lines: Vec<(Vec<u8>, Vec<KeyValue>, usize)>,
    ttls: &HashMap<i64, Option<LeaseTtl>>,
) -> WaitGraph {
    let found = cycles::search(
        lines
            .iter()
            .map(|(name_prefix, kvs, _)| cycles::Line {
                prefix: name_prefix.clone(),
                keys: kvs.iter().map(|kv| (kv.key.clone(), kv.lease)).collect(),
            })
            .collect(),
    );
    let names: Vec<Status> = lines
        .into_iter()
        .map(|(name_prefix, kvs, holding)| {
            let mut holders: Vec<Holder> = kvs
                .into_iter()
                .map(|kv| {
                    let ttl = ttls.get(&kv.lease).copied().flatten().map(|t| t.left);
                    Holder::of(&name_prefix, kv, ttl)
                })
                .collect();
            let waiters = holders.split_off(holding);
            Status {
                name: name_prefix[..name_prefix.len() - 1].to_vec(),
                holders,
                waiters,
                revision,
            }
        })
        .collect();

    let mut participants: BTreeMap<i64, Participant> = BTreeMap::new();
    let mut oldest_value: HashMap<i64, (i64, String)> = HashMap::new();
    let new_participant = |lease: i64| {
        let ttl = ttls.get(&lease).copied().flatten();
        Participant {
            lease,
            identity: None,
            ttl: ttl.map(|t| t.left),
            granted_ttl: ttl.map(|t| t.granted),
            holds: Vec::new(),
            waits: Vec::new(),
            stuck: found.stuck.contains(&lease),
        }
    };
    for status in &names {
        let mut blocked_by: Vec<i64> = Vec::new();
        for holder in &status.holders {
            if !blocked_by.contains(&holder.lease) {
                blocked_by.push(holder.lease);
            }
        }
        let keys = status.holders.iter().chain(&status.waiters);
        for (position, key) in keys.enumerate() {
            let holds = position < status.holders.len();
            if !holds && (key.mode == KeyMode::Other || key.lease == 0) {
                continue; // data behind a holder: waits for nothing
            }
            if key.mode != KeyMode::Other
                && let Some(identity) = key.identity()
                && oldest_value
                    .get(&key.lease)
                    .is_none_or(|(rev, _)| key.create_revision < *rev)
            {
                oldest_value.insert(key.lease, (key.create_revision, identity.into_owned()));
            }
            let place = Place {
                name: status.name.clone(),
                key: key.clone(),
                position,
                blocked_by: if holds {
                    Vec::new()
                } else {
                    blocked_by.clone()
                },
            };
            let p = participants
                .entry(key.lease)
                .or_insert_with(|| new_participant(key.lease));
            if holds { &mut p.holds } else { &mut p.waits }.push(place);
        }
    }
    for (lease, (_, identity)) in oldest_value {
        if let Some(p) = participants.get_mut(&lease) {
            p.identity = Some(identity);
        }
    }
    let name_of = |i: usize| names[i].name.clone();
    let cycles = found
        .cycles
        .iter()
        .map(|ring| Cycle {
            steps: ring
                .iter()
                .map(|&(lease, line, holder)| CycleStep {
                    lease,
                    name: name_of(line),
                    holder,
                    identity: participants.get(&lease).and_then(|p| p.identity.clone()),
                })
                .collect(),
        })
        .collect();
    WaitGraph {
        prefix,
        revision,
        participants: participants.into_values().collect(),
        names,
        cycles,
    }
}
