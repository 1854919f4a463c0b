//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (cargo feature `metrics`):
//! every metric name lives here, and the rest of the crate calls one function per event.
//!
//! Without the feature every function is an empty `#[inline]` body and [`Stopwatch`] is a
//! zero-sized type, so call sites need no `cfg` and cost nothing. Labels are built only
//! inside the functions, so no label is formatted unless the feature is on.
//! docs/operations.md "Metrics" documents names, types, labels and their cardinality.

// Without the feature the functions only swallow their arguments.
#![cfg_attr(not(feature = "metrics"), allow(unused_variables))]

#[cfg(feature = "metrics")]
use std::time::Instant;

use crate::support::error::loss::LossReason;
use crate::support::error::operation::Operation;

/// The names of the metrics etcd-sync emits through the
/// [`metrics`](https://docs.rs/metrics) facade, and of their labels, for exporter settings
/// such as histogram buckets. docs/operations.md "Metrics" describes each one.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
/// // Prometheus histograms (not summaries) for the wait and hold times, in seconds.
/// let buckets = [0.001, 0.01, 0.1, 1.0, 10.0, 60.0];
/// let recorder = PrometheusBuilder::new()
///     .set_buckets_for_metric(Matcher::Full(etcd_sync::metric_names::WAIT_SECONDS.into()), &buckets)?
///     .set_buckets_for_metric(Matcher::Full(etcd_sync::metric_names::HOLD_SECONDS.into()), &buckets)?
///     .build_recorder();
/// # drop(recorder);
/// # Ok(()) }
/// ```
#[cfg(feature = "metrics")]
pub mod names {
    /// Counter: acquisitions (a lock, read or write lock, permit or leadership obtained).
    /// Labels [`NAME`], [`PRIMITIVE`].
    pub const ACQUISITIONS: &str = "etcd_sync_acquisitions_total";
    /// Histogram, seconds: from the call (`lock()`, `campaign()`, ...) to the guard, for
    /// successful acquisitions (`try_*` included). Labels [`NAME`], [`PRIMITIVE`].
    pub const WAIT_SECONDS: &str = "etcd_sync_wait_seconds";
    /// Histogram, seconds: from the acquisition to its release (`release()`, `resign()` or
    /// `drop`) while the session was alive. Labels [`NAME`], [`PRIMITIVE`].
    pub const HOLD_SECONDS: &str = "etcd_sync_hold_seconds";
    /// Counter: holds that ended other than by their own release. Labels [`NAME`],
    /// [`PRIMITIVE`], [`REASON`]: `key_deleted` (the key was deleted or taken over while
    /// the session looked alive: `etcdctl del`, a revoke from elsewhere seen through the
    /// key first) or the session's loss reason (`revoked`, `expired`, `closed`,
    /// `orphaned`, `client_closed`), counted when the guard is released or dropped.
    pub const LOSSES: &str = "etcd_sync_losses_total";
    /// Counter: sessions that ended, at the moment this process knew. Label [`REASON`]:
    /// `revoked`, `expired`, `closed`, `orphaned`, `client_closed`.
    pub const SESSIONS_ENDED: &str = "etcd_sync_sessions_ended_total";
    /// Counter: leadership changes of this process. Labels [`NAME`], [`EVENT`]: `elected`,
    /// `resigned` (released by this process), `lost` (ended any other way; see [`LOSSES`]).
    pub const LEADERSHIP_TRANSITIONS: &str = "etcd_sync_leadership_transitions_total";
    /// Gauge, seconds: how long before the lease's deadline the last keep-alive
    /// acknowledgement arrived (any session of the process). Near 0: the session almost
    /// expired. No labels.
    pub const KEEPALIVE_MARGIN_SECONDS: &str = "etcd_sync_keepalive_margin_seconds";
    /// Counter: a client switched its current etcd endpoint. Labels [`FROM`], [`TO`]
    /// (endpoint URLs as configured).
    pub const FAILOVERS: &str = "etcd_sync_failovers_total";
    /// Counter: auth tokens renewed after etcd refused or outdated one (the first
    /// authentication of `connect()` is not counted). No labels.
    pub const REAUTHENTICATIONS: &str = "etcd_sync_reauthentications_total";

    /// Label: the lock or election name, as text (invalid UTF-8 replaced).
    pub const NAME: &str = "name";
    /// Label: `mutex`, `rwlock_read`, `rwlock_write`, `semaphore` or `election`.
    pub const PRIMITIVE: &str = "primitive";
    /// Label: why a hold or session ended.
    pub const REASON: &str = "reason";
    /// Label: `elected`, `resigned` or `lost`.
    pub const EVENT: &str = "event";
    /// Label: the endpoint a failover left.
    pub const FROM: &str = "from";
    /// Label: the endpoint a failover moved to.
    pub const TO: &str = "to";
}

#[cfg(feature = "metrics")]
use names::*;

/// A start time, kept only with the feature (zero-sized without it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch {
    #[cfg(feature = "metrics")]
    started: Instant,
}

impl Stopwatch {
    #[inline]
    pub(crate) fn start() -> Stopwatch {
        Stopwatch {
            #[cfg(feature = "metrics")]
            started: crate::support::clock::now(),
        }
    }
}

/// An acquisition of `name` by the wait `operation`, after `waited`.
#[inline]
pub(crate) fn acquired(name: &[u8], operation: Operation, waited: Stopwatch) {
    #[cfg(feature = "metrics")]
    {
        describe();
        let labels = labels(name, operation);
        metrics::counter!(ACQUISITIONS, labels.iter()).increment(1);
        metrics::histogram!(WAIT_SECONDS, labels.iter())
            .record(crate::support::clock::since(waited.started));
        if operation == Operation::Campaign {
            leadership(name, "elected");
        }
    }
}

/// A hold acquired at `acquired` was released by its guard. `session_loss` tells whether
/// the session had been lost by then: that hold ended with the session, not here.
#[inline]
pub(crate) fn released(
    name: &[u8],
    operation: Operation,
    acquired: Stopwatch,
    session_loss: impl FnOnce() -> Option<LossReason>,
) {
    #[cfg(feature = "metrics")]
    {
        if let Some(reason) = session_loss() {
            return lost(name, operation, loss_label(&reason));
        }
        describe();
        let labels = labels(name, operation);
        metrics::histogram!(HOLD_SECONDS, labels.iter())
            .record(crate::support::clock::since(acquired.started));
        if operation == Operation::Campaign {
            leadership(name, "resigned");
        }
    }
}

/// A hold's key was deleted or taken over; `session_loss` names the session's loss if it
/// was already known (a revoked lease deletes the key too).
#[inline]
pub(crate) fn key_lost(
    name: &[u8],
    operation: Operation,
    session_loss: impl FnOnce() -> Option<LossReason>,
) {
    #[cfg(feature = "metrics")]
    {
        let reason = session_loss().map_or("key_deleted", |reason| loss_label(&reason));
        lost(name, operation, reason);
    }
}

/// A session ended (counted once per session).
#[inline]
pub(crate) fn session_ended(reason: &LossReason) {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::counter!(SESSIONS_ENDED, REASON => loss_label(reason)).increment(1);
    }
}

/// A keep-alive was acknowledged while the lease was trusted until `deadline`.
#[inline]
pub(crate) fn keepalive_acknowledged(deadline: std::time::Instant) {
    #[cfg(feature = "metrics")]
    {
        describe();
        let margin = deadline.saturating_duration_since(crate::support::clock::now());
        metrics::gauge!(KEEPALIVE_MARGIN_SECONDS).set(margin.as_secs_f64());
    }
}

/// The client's current endpoint moved from `from` to `to`.
#[inline]
pub(crate) fn failover(from: &str, to: &str) {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::counter!(FAILOVERS, FROM => from.to_owned(), TO => to.to_owned()).increment(1);
    }
}

/// A new auth token was stored; `replaced`: it replaced an earlier one.
#[inline]
pub(crate) fn authenticated(replaced: bool) {
    #[cfg(feature = "metrics")]
    if replaced {
        describe();
        metrics::counter!(REAUTHENTICATIONS).increment(1);
    }
}

#[cfg(feature = "metrics")]
fn lost(name: &[u8], operation: Operation, reason: &'static str) {
    describe();
    let mut labels = labels(name, operation);
    labels.push(metrics::Label::new(REASON, reason));
    metrics::counter!(LOSSES, labels.iter()).increment(1);
    if operation == Operation::Campaign {
        leadership(name, "lost");
    }
}

#[cfg(feature = "metrics")]
fn leadership(name: &[u8], event: &'static str) {
    metrics::counter!(
        LEADERSHIP_TRANSITIONS,
        NAME => String::from_utf8_lossy(name).into_owned(),
        EVENT => event
    )
    .increment(1);
}

/// The `name` and `primitive` labels of a hold.
#[cfg(feature = "metrics")]
fn labels(name: &[u8], operation: Operation) -> Vec<metrics::Label> {
    vec![
        metrics::Label::new(NAME, String::from_utf8_lossy(name).into_owned()),
        metrics::Label::new(PRIMITIVE, primitive(operation)),
    ]
}

/// The primitive behind a wait's operation.
#[cfg(feature = "metrics")]
fn primitive(operation: Operation) -> &'static str {
    match operation {
        Operation::Lock => "mutex",
        Operation::Read => "rwlock_read",
        Operation::Write => "rwlock_write",
        Operation::Acquire => "semaphore",
        Operation::Campaign => "election",
        // Not the operation of a hold; named as in errors should one ever get here.
        other => other.as_str(),
    }
}

#[cfg(feature = "metrics")]
fn loss_label(reason: &LossReason) -> &'static str {
    match reason {
        LossReason::Closed => "closed",
        LossReason::Orphaned => "orphaned",
        LossReason::Revoked => "revoked",
        LossReason::Expired => "expired",
        LossReason::ClientClosed => "client_closed",
    }
}

/// Units and help texts, given to the recorder installed when the first metric is emitted.
#[cfg(feature = "metrics")]
fn describe() {
    use metrics::Unit;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        metrics::describe_counter!(ACQUISITIONS, "Locks, permits and leaderships acquired");
        metrics::describe_histogram!(
            WAIT_SECONDS,
            Unit::Seconds,
            "Time from the call to the guard"
        );
        metrics::describe_histogram!(
            HOLD_SECONDS,
            Unit::Seconds,
            "Time from acquisition to release"
        );
        metrics::describe_counter!(LOSSES, "Holds that ended other than by their release");
        metrics::describe_counter!(SESSIONS_ENDED, "Sessions (leases) that ended, by reason");
        metrics::describe_counter!(LEADERSHIP_TRANSITIONS, "Leadership changes of this process");
        metrics::describe_gauge!(
            KEEPALIVE_MARGIN_SECONDS,
            Unit::Seconds,
            "Time left before the lease deadline when the last keep-alive was acknowledged"
        );
        metrics::describe_counter!(FAILOVERS, "Switches of the current etcd endpoint");
        metrics::describe_counter!(REAUTHENTICATIONS, "Auth tokens renewed");
    });
}
