//! What a member of the simulated cluster answers: etcd's KV, Watch, Lease and Maintenance
//! gRPC services over the shared state (one store: the members are replicas that agree),
//! with the member's faults applied in front of every call.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc::unbounded_channel;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status, Streaming};

use super::after::AfterWrites;
use super::leases::Leases;
use super::store::{Refusal, Store};
use super::watchers::Watchers;
use crate::transport::generated::etcdserverpb as pb;
use pb::request_op::Request as Op;

/// One member's condition, as the cluster's faults set it.
#[derive(Debug, Clone)]
pub(crate) struct MemberState {
    pub(crate) id: u64,
    /// Serving connections (false: stopped; dials are refused).
    pub(crate) up: bool,
    /// Takes requests but answers none until thawed (a stopped process, a full disk).
    pub(crate) frozen: bool,
    /// A learner: answers Status, refuses everything else.
    pub(crate) learner: bool,
    /// Applies writes but never answers them (the answer is lost): ambiguous writes.
    pub(crate) swallow_writes: bool,
    /// Applies writes this long after they arrive, and never answers them: the client
    /// times out and retries elsewhere first (a member that had the proposal in its log).
    pub(crate) late_writes: Option<std::time::Duration>,
    /// Behind the leader by this much (see `lag.rs`): its answers and events come that
    /// much late, and its serializable reads see the store as it was.
    pub(crate) lag: Option<std::time::Duration>,
    /// Linearizable reads wait this long for their read index (see `lag.rs`).
    pub(crate) read_wait: Option<std::time::Duration>,
}

/// The cluster's state: the replicated store and leases, the watchers of every member's
/// streams, and the members.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) store: Store,
    pub(crate) leases: Leases,
    pub(crate) watchers: Watchers,
    pub(crate) members: Vec<MemberState>,
    pub(crate) leader: Option<usize>,
    pub(crate) raft_term: u64,
    /// Register every n-th watcher from "now" as unsynced (0: never), as etcd does when a
    /// write lands while it registers one.
    pub(crate) unsynced_every: u64,
    pub(crate) from_now: u64,
    /// How often watchers that ask for them get progress notifications (`None`: never).
    pub(crate) progress_interval: Option<std::time::Duration>,
    /// When recent revisions were applied (for the serializable reads of a member behind).
    pub(crate) applied: super::lag::Applied,
    /// A key that appears and goes around the writes that put it (`flicker.rs`).
    pub(crate) flicker: Option<super::flicker::Flicker>,
    /// A fault that strikes after a number of answered writes, refused deletes (`after.rs`).
    pub(crate) after_writes: super::after::Faults,
}

impl State {
    /// Strikes with a fault of `after.rs`, once its writes are answered.
    pub(crate) fn strike(&mut self, fault: AfterWrites) {
        match fault {
            AfterWrites::LoseLeader => self.leader = None,
            AfterWrites::SwallowAnswers => {
                for member in &mut self.members {
                    member.swallow_writes = true;
                }
            }
            AfterWrites::DenyDeletes => self.after_writes.deny_deletes = true,
            AfterWrites::TimeOutDeletes => self.after_writes.time_out_deletes = true,
        }
    }
}

/// What every member shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) cluster_id: u64,
    /// Woken when a member thaws.
    pub(crate) thawed: tokio::sync::Notify,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The services of member `index`.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub(crate) shared: Arc<Shared>,
    pub(crate) index: usize,
}

const NO_LEADER: &str = "etcdserver: no leader";
const LEARNER: &str = "etcdserver: rpc not supported for learner";

impl Member {
    /// The header this member puts on an answer at store revision `revision`.
    fn header(&self, state: &State, revision: i64) -> pb::ResponseHeader {
        pb::ResponseHeader {
            cluster_id: self.shared.cluster_id,
            member_id: state.members.get(self.index).map_or(0, |m| m.id),
            revision,
            raft_term: state.raft_term,
        }
    }

    /// One of this member's delays (its lag, its reads' wait), if it has it.
    fn delay(
        &self,
        of: fn(&MemberState) -> Option<std::time::Duration>,
    ) -> Option<std::time::Duration> {
        self.shared.lock().members.get(self.index).and_then(of)
    }

    /// This member's lag, if it is behind.
    fn lag(&self) -> Option<std::time::Duration> {
        self.delay(|m| m.lag)
    }

    /// Waits while the member is frozen, then refuses as etcd would, if it would. A member
    /// that is behind takes its lag first (it serves a request once it has applied what
    /// the cluster had committed when it came).
    async fn admit(&self) -> Result<(), Status> {
        if let Some(lag) = self.lag() {
            tokio::time::sleep(lag).await;
        }
        loop {
            let thawed = self.shared.thawed.notified();
            {
                let state = self.shared.lock();
                let member = state.members.get(self.index);
                if !member.is_some_and(|m| m.frozen) {
                    if member.is_some_and(|m| m.learner) {
                        return Err(Status::unavailable(LEARNER));
                    }
                    if state.leader.is_none() {
                        return Err(Status::unavailable(NO_LEADER));
                    }
                    return Ok(());
                }
            }
            thawed.await;
        }
    }

    /// After a write: an answer this member swallows never comes.
    async fn answer<T>(&self, answer: T) -> Result<Response<T>, Status> {
        let swallow = {
            let mut state = self.shared.lock();
            let swallow = state
                .members
                .get(self.index)
                .is_some_and(|m| m.swallow_writes);
            if let Some(fault) = super::after::answered(&mut state.after_writes) {
                state.strike(fault);
            }
            swallow
        };
        if swallow {
            std::future::pending::<()>().await;
        }
        Ok(Response::new(answer))
    }

    /// If this member applies writes late: applies `req` after the delay, in a task of
    /// its own (the client's timeout does not cancel it), and never answers.
    async fn late(&self, req: &pb::TxnRequest) {
        let late = {
            let state = self.shared.lock();
            state.members.get(self.index).and_then(|m| m.late_writes)
        };
        if let Some(delay) = late {
            let (member, req) = (self.clone(), req.clone());
            drop(tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = member.apply(&req);
            }));
            std::future::pending::<()>().await;
        }
    }

    /// Applies a transaction and tells the watchers.
    fn apply(&self, req: &pb::TxnRequest) -> Result<pb::TxnResponse, Status> {
        let mut state = self.shared.lock();
        if super::after::denied(&state.after_writes, req) {
            return Err(Status::permission_denied("etcdserver: permission denied"));
        }
        if super::after::timed_out(&state.after_writes, req) {
            return Err(Status::unavailable(super::after::TIMED_OUT));
        }
        let State {
            store,
            leases,
            watchers,
            flicker,
            ..
        } = &mut *state;
        let flickered = super::flicker::before(flicker, (store, leases, watchers), req);
        let applied = store.txn(req, &|id| leases.exists(id));
        if let Ok((_, changes)) = &applied {
            watchers.notify(changes, store.revision());
        }
        let revision = state.store.revision();
        state.applied.record(revision);
        let header = self.header(&state, revision);
        if let Some(key) = flickered {
            let State {
                store,
                watchers,
                applied,
                ..
            } = &mut *state;
            super::flicker::after((store, watchers, applied), key);
        }
        let (mut resp, _) = applied.map_err(|r| r.status())?;
        resp.header = Some(header);
        Ok(resp)
    }
}

/// A transaction of one op and no compare: how a Put or a DeleteRange is applied.
fn single(op: Op) -> pb::TxnRequest {
    pb::TxnRequest {
        success: vec![pb::RequestOp { request: Some(op) }],
        ..Default::default()
    }
}

/// Revokes `id` and deletes its keys in one revision (`expired`: because its TTL ran out);
/// false if there was no such lease.
pub(crate) fn revoke(state: &mut State, id: i64, expired: bool) -> bool {
    if !state.leases.remove(id) {
        return false;
    }
    let keys = state.store.keys_of_lease(id);
    let names = keys
        .iter()
        .map(|key| String::from_utf8_lossy(key).into_owned())
        .collect();
    state
        .leases
        .ended(id, tokio::time::Instant::now(), names, expired);
    let changes = state.store.delete_keys(&keys);
    state.watchers.notify(&changes, state.store.revision());
    let revision = state.store.revision();
    state.applied.record(revision);
    true
}

fn first_response(resp: pb::TxnResponse) -> Option<pb::response_op::Response> {
    resp.responses.into_iter().next().and_then(|r| r.response)
}

#[tonic::async_trait]
impl pb::kv_server::Kv for Member {
    async fn range(
        &self,
        request: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        let lag = self.lag();
        self.admit().await?;
        let req = request.get_ref();
        if !req.serializable
            && let Some(wait) = self.delay(|m| m.read_wait)
        {
            tokio::time::sleep(wait).await;
        }
        let state = self.shared.lock();
        if state.after_writes.time_out_reads {
            return Err(Status::unavailable(super::after::TIMED_OUT));
        }
        // A serializable read is served from this member's own store: behind the
        // cluster's by its lag.
        let now = match lag {
            Some(lag) if req.serializable => state
                .applied
                .revision_at(tokio::time::Instant::now() - lag, state.store.revision()),
            _ => state.store.revision(),
        };
        let mut resp = state.store.range_at(req, now).map_err(|r| r.status())?;
        resp.header = Some(self.header(&state, now));
        Ok(Response::new(resp))
    }

    async fn put(
        &self,
        request: Request<pb::PutRequest>,
    ) -> Result<Response<pb::PutResponse>, Status> {
        self.admit().await?;
        let txn = single(Op::RequestPut(request.into_inner()));
        self.late(&txn).await;
        let resp = self.apply(&txn)?;
        let header = resp.header;
        let mut put = match first_response(resp) {
            Some(pb::response_op::Response::ResponsePut(put)) => put,
            _ => pb::PutResponse::default(),
        };
        put.header = header;
        self.answer(put).await
    }

    async fn delete_range(
        &self,
        request: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        self.admit().await?;
        let req = request.into_inner();
        if req.key.is_empty() {
            return Err(Refusal::EMPTY_KEY.status());
        }
        let txn = single(Op::RequestDeleteRange(req));
        self.late(&txn).await;
        let resp = self.apply(&txn)?;
        let header = resp.header;
        let mut delete = match first_response(resp) {
            Some(pb::response_op::Response::ResponseDeleteRange(delete)) => delete,
            _ => pb::DeleteRangeResponse::default(),
        };
        delete.header = header;
        self.answer(delete).await
    }

    async fn txn(
        &self,
        request: Request<pb::TxnRequest>,
    ) -> Result<Response<pb::TxnResponse>, Status> {
        self.admit().await?;
        self.late(request.get_ref()).await;
        let resp = self.apply(request.get_ref())?;
        self.answer(resp).await
    }

    async fn compact(
        &self,
        request: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        self.admit().await?;
        let mut state = self.shared.lock();
        state
            .store
            .compact(request.get_ref().revision)
            .map_err(|r| r.status())?;
        let header = self.header(&state, state.store.revision());
        Ok(Response::new(pb::CompactionResponse {
            header: Some(header),
        }))
    }
}

#[tonic::async_trait]
impl pb::watch_server::Watch for Member {
    async fn watch(
        &self,
        request: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<BoxStream<pb::WatchResponse>>, Status> {
        self.admit().await?;
        let mut incoming = request.into_inner();
        let (out, answers) = unbounded_channel();
        let stream = self.shared.lock().watchers.open(out);
        let member = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(req)) = incoming.message().await {
                use pb::watch_request::RequestUnion;
                let mut state = member.shared.lock();
                let State {
                    store,
                    watchers,
                    unsynced_every,
                    from_now,
                    ..
                } = &mut *state;
                match req.request_union {
                    Some(RequestUnion::CreateRequest(create)) => {
                        let mut unsynced = false;
                        if create.start_revision == 0 && *unsynced_every > 0 {
                            *from_now += 1;
                            unsynced = (*from_now).is_multiple_of(*unsynced_every);
                        }
                        watchers.create(stream, &create, store, unsynced);
                    }
                    Some(RequestUnion::CancelRequest(cancel)) => {
                        watchers.cancel(stream, cancel.watch_id, store);
                    }
                    _ => {}
                }
            }
            member.shared.lock().watchers.close(stream);
        });
        let lagging = self.clone();
        let lag_of = move || lagging.lag().unwrap_or_default();
        let answers = super::lag::delayed(lag_of, answers);
        let member = self.clone();
        let answers = UnboundedReceiverStream::new(answers).map(move |mut answer| {
            let state = member.shared.lock();
            let revision = answer.header.as_ref().map_or(0, |h| h.revision);
            answer.header = Some(member.header(&state, revision));
            Ok(answer)
        });
        Ok(Response::new(Box::pin(answers)))
    }
}

#[tonic::async_trait]
impl pb::lease_server::Lease for Member {
    async fn lease_grant(
        &self,
        request: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        self.admit().await?;
        let req = request.into_inner();
        let now = tokio::time::Instant::now();
        let (id, ttl, header) = {
            let mut state = self.shared.lock();
            let (id, ttl) = state
                .leases
                .grant(req.id, req.ttl, now)
                .map_err(|r| r.status())?;
            (id, ttl, self.header(&state, state.store.revision()))
        };
        self.answer(pb::LeaseGrantResponse {
            header: Some(header),
            id,
            ttl,
            error: String::new(),
        })
        .await
    }

    async fn lease_revoke(
        &self,
        request: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        self.admit().await?;
        let header = {
            let mut state = self.shared.lock();
            if !revoke(&mut state, request.get_ref().id, false) {
                return Err(Refusal::LEASE_NOT_FOUND.status());
            }
            self.header(&state, state.store.revision())
        };
        self.answer(pb::LeaseRevokeResponse {
            header: Some(header),
        })
        .await
    }

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<BoxStream<pb::LeaseKeepAliveResponse>>, Status> {
        self.admit().await?;
        let mut incoming = request.into_inner();
        let (out, answers) = unbounded_channel();
        let member = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(req)) = incoming.message().await {
                if let Err(refused) = member.admit().await {
                    let _ = out.send(Err(refused));
                    break;
                }
                let now = tokio::time::Instant::now();
                if member.shared.lock().leases.is_starved(req.id) {
                    continue;
                }
                let (ttl, header) = {
                    let mut state = member.shared.lock();
                    let ttl = state.leases.renew(req.id, now).unwrap_or(0);
                    (ttl, member.header(&state, state.store.revision()))
                };
                let answer = pb::LeaseKeepAliveResponse {
                    header: Some(header),
                    id: req.id,
                    ttl,
                };
                if out.send(Ok(answer)).is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
            answers,
        ))))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        self.admit().await?;
        let req = request.into_inner();
        let now = tokio::time::Instant::now();
        let state = self.shared.lock();
        let header = Some(self.header(&state, state.store.revision()));
        let resp = match state.leases.time_to_live(req.id, now) {
            Some((ttl, granted_ttl)) => pb::LeaseTimeToLiveResponse {
                header,
                id: req.id,
                ttl,
                granted_ttl,
                keys: if req.keys {
                    state.store.keys_of_lease(req.id)
                } else {
                    Vec::new()
                },
            },
            None => pb::LeaseTimeToLiveResponse {
                header,
                id: req.id,
                ttl: -1,
                ..Default::default()
            },
        };
        Ok(Response::new(resp))
    }
}

#[tonic::async_trait]
impl pb::maintenance_server::Maintenance for Member {
    async fn status(
        &self,
        _: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        // Status is answered without a leader, and by a learner (but not while frozen).
        loop {
            let thawed = self.shared.thawed.notified();
            if !self
                .shared
                .lock()
                .members
                .get(self.index)
                .is_some_and(|m| m.frozen)
            {
                break;
            }
            thawed.await;
        }
        let state = self.shared.lock();
        let revision = state.store.revision();
        Ok(Response::new(pb::StatusResponse {
            header: Some(self.header(&state, revision)),
            version: if state.store.keeps_compacted_tombstones {
                super::SIMULATED_FIXED_VERSION
            } else {
                super::SIMULATED_VERSION
            }
            .to_string(),
            db_size: 20_480 + revision * 64,
            leader: state
                .leader
                .and_then(|l| state.members.get(l))
                .map_or(0, |m| m.id),
            raft_index: u64::try_from(revision).unwrap_or(0) + 3,
            raft_term: state.raft_term,
            raft_applied_index: u64::try_from(revision).unwrap_or(0) + 3,
            errors: Vec::new(),
            db_size_in_use: 20_480 + revision * 32,
            is_learner: state.members.get(self.index).is_some_and(|m| m.learner),
        }))
    }
}
