//! A multi-lock is all or none (issue 30): after a failed attempt, no key of its session's
//! lease may be left under any name of its set. The multi-lock thread looks right after
//! the attempt returns (`MLEFT`), and, if it finds any, again one request timeout and a
//! half later: a removal etcd has not answered when the wait's settle window ends goes on
//! in the background (`ownership/acquire.rs`, `settle_by`), and must be answered by then.
//! A key still there is a leak; one gone by then is counted and printed, not a violation.

use std::time::Duration;

use etcd_sync::Client;

use super::common::monotonic_ns;
use super::{Log, REQUEST_TIMEOUT, log};

/// An `MLEFT <id> <at> <left> <after> <keys>` line: the attempt, when it looked, how many
/// keys of its lease were left under its names then and one request timeout and a half
/// later (`None`: a name could not be read, `?` in the log), and which keys
/// (`key@create revision`, `-` for none).
pub(crate) struct Look {
    pub(crate) id: String,
    pub(crate) at: u64,
    pub(crate) left: Option<u64>,
    pub(crate) after: Option<u64>,
    pub(crate) keys: String,
}

impl Look {
    /// The `Look` of an `MLEFT` line's fields, if it is one.
    pub(crate) fn parse(f: &[&str]) -> Option<Look> {
        let [_, id, at, left, after, keys] = f else {
            return None;
        };
        Some(Look {
            id: id.to_string(),
            at: at.parse().ok()?,
            left: left.parse().ok(),
            after: after.parse().ok(),
            keys: keys.to_string(),
        })
    }
}

/// After attempt `id` on `names` failed: logs its `MLEFT` line.
pub(crate) fn look(client: &Client, log_file: &Log, id: &str, names: &[&str], lease: i64) {
    let left = keys_of(client, names, lease);
    let at = monotonic_ns();
    let after = match &left {
        Some(keys) if !keys.is_empty() => {
            std::thread::sleep(REQUEST_TIMEOUT + Duration::from_millis(500));
            keys_of(client, names, lease)
        }
        _ => Some(Vec::new()),
    };
    let count =
        |keys: &Option<Vec<String>>| keys.as_ref().map_or("?".into(), |k| k.len().to_string());
    let listed = (left.as_ref())
        .filter(|k| !k.is_empty())
        .map_or("-".into(), |k| k.join(","));
    log(
        log_file,
        format!(
            "MLEFT {id} {at} {} {} {listed}",
            count(&left),
            count(&after)
        ),
    );
}

/// The keys of `lease` under `names` (`key@create revision`); `None` if a name could not
/// be read.
fn keys_of(client: &Client, names: &[&str], lease: i64) -> Option<Vec<String>> {
    let mut keys = Vec::new();
    for n in names {
        let kvs = client.get_prefix(format!("{n}/")).ok()?;
        keys.extend((kvs.iter().filter(|kv| kv.lease == lease)).map(|kv| {
            format!(
                "{}@{}",
                String::from_utf8_lossy(&kv.key),
                kv.create_revision
            )
        }));
    }
    Some(keys)
}

/// The attempt a look is of, as the multi-lock checks know it.
pub(crate) struct Tried<'a> {
    pub(crate) names: &'a [String],
    pub(crate) outcome: Option<&'a str>,
    pub(crate) start: u64,
    pub(crate) end: u64,
}

/// What the looks tell.
#[derive(Default)]
pub(crate) struct Verdicts {
    /// Looks judged (no fault near).
    pub(crate) judged: u64,
    /// Keys gone one request timeout and a half later: removals answered after the wait
    /// returned.
    pub(crate) removed_late: Vec<String>,
    /// Keys still there then: leaks (safety violations).
    pub(crate) leaks: Vec<String>,
}

/// Judges the looks of attempts `tried(id)` with no fault near (`quiet_near(attempt, at)`).
pub(crate) fn judge<'a>(
    looks: &[Look],
    tried: impl Fn(&str) -> Option<Tried<'a>>,
    quiet_near: impl Fn(&Tried<'a>, u64) -> bool,
) -> Verdicts {
    let mut verdicts = Verdicts::default();
    for Look {
        id,
        at,
        left,
        after,
        keys,
    } in looks
    {
        let (Some(a), Some(left)) = (tried(id), left) else {
            continue;
        };
        if !quiet_near(&a, *at) {
            continue;
        }
        verdicts.judged += 1;
        let what = format!(
            "multi-lock {id} on {:?} ended {:?} ({} ms after it began) and {} ms later had \
             {left} keys of its lease under them: {keys}",
            a.names,
            a.outcome,
            a.end.saturating_sub(a.start) / 1_000_000,
            at.saturating_sub(a.end) / 1_000_000,
        );
        match (left, after) {
            (0, _) => {}
            (_, Some(0)) => verdicts.removed_late.push(what),
            (_, after) => verdicts.leaks.push(format!(
                "{what}; one request timeout and a half later: {after:?} (all or none)"
            )),
        }
    }
    verdicts
}
