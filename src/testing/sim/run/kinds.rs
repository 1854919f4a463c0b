//! What the simulated processes take (a mutex, a permit, a read or write lock, leadership)
//! and the store's view of a name's line, for the invariants: which key holds, and whether
//! a key is still there.

use super::World;
use crate::support::error::Error;

/// How many permits the simulated semaphore has.
pub(super) const PERMITS: usize = 2;

/// What a process takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Mutex,
    Permit,
    Read,
    Write,
    Lead,
}

impl Kind {
    pub(super) const ALL: [Kind; 5] = [
        Kind::Mutex,
        Kind::Permit,
        Kind::Read,
        Kind::Write,
        Kind::Lead,
    ];

    /// Every name taken.
    pub(super) const NAMES: [&'static str; 4] = ["m", "s", "r", "e"];

    /// The name it is taken under (reads and writes share one).
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Mutex => "m",
            Kind::Permit => "s",
            Kind::Read | Kind::Write => "r",
            Kind::Lead => "e",
        }
    }

    /// What follows the lease in its key (see `line/mode.rs`).
    pub(super) fn suffix(self) -> String {
        match self {
            Kind::Mutex | Kind::Write | Kind::Lead => String::new(),
            Kind::Read => ".shared".into(),
            Kind::Permit => format!(".permits-{PERMITS}"),
        }
    }

    /// Whether a key of this kind holds with `older` (the keys created before it).
    pub(super) fn admits(self, older: &[&str]) -> bool {
        match self {
            Kind::Mutex | Kind::Write | Kind::Lead => older.is_empty(),
            Kind::Read => older.iter().all(|k| k.ends_with(".shared")),
            Kind::Permit => older.len() < PERMITS,
        }
    }

    /// Whether these holders (their kinds) may hold one name together.
    pub(super) fn may_share(holders: &[Kind]) -> bool {
        let writers = holders
            .iter()
            .filter(|k| matches!(k, Kind::Mutex | Kind::Write | Kind::Lead))
            .count();
        let permits = holders.iter().filter(|k| **k == Kind::Permit).count();
        (writers == 0 || holders.len() == 1) && permits <= PERMITS
    }

    /// Whether successive holders of the name have growing fencing tokens.
    pub(super) fn exclusive_name(self) -> bool {
        matches!(self, Kind::Mutex | Kind::Lead)
    }
}

/// An error's kind for the trace (its text names endpoints, which differ between runs).
pub(super) fn kind(e: &Error) -> &'static str {
    if e.is_wait_timeout() {
        "wait timeout"
    } else if e.is_cancelled() {
        "cancelled"
    } else if e.is_deadlock() {
        "deadlock"
    } else if e.is_session_lost() {
        "session lost"
    } else if e.is_lost() {
        "lock lost"
    } else if e.is_timeout() {
        "request timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_retryable() {
        "unavailable"
    } else {
        "other"
    }
}

/// The keys under `name` with their create revisions, oldest first.
pub(super) fn line(world: &World, name: &str) -> Vec<(String, i64)> {
    let mut keys = world.cluster.keys(&format!("{name}/"));
    keys.sort_by_key(|(_, rev)| *rev);
    keys
}

/// Whether `key` holds in `line` for `kind`; `None` if it is not there.
pub(super) fn admitted(line: &[(String, i64)], key: &str, kind: Kind) -> Option<bool> {
    let at = line.iter().position(|(k, _)| k == key)?;
    let older: Vec<&str> = line[..at].iter().map(|(k, _)| k.as_str()).collect();
    Some(kind.admits(&older))
}

/// The key `lease` has in `line` for `kind`, if any (`<name>/<lease hex><mode suffix>`).
pub(super) fn own_key(line: &[(String, i64)], kind: Kind, lease: i64) -> Option<String> {
    let ours = format!("{}/{lease:x}{}", kind.name(), kind.suffix());
    line.iter().map(|(k, _)| k).find(|k| **k == ours).cloned()
}

/// Whether `key` is in the store with create revision `token`.
pub(super) fn present(world: &World, name: &str, key: &str, token: i64) -> bool {
    line(world, name)
        .iter()
        .any(|(k, rev)| k == key && *rev == token)
}

/// The value `key` has in the store, if it is there.
pub(super) fn value_of(world: &World, key: &str) -> Option<Vec<u8>> {
    let range = crate::transport::generated::etcdserverpb::RangeRequest {
        key: key.as_bytes().to_vec(),
        ..Default::default()
    };
    let state = world.cluster.shared.lock();
    let kv = state.store.range(&range).ok()?.kvs.into_iter().next()?;
    Some(kv.value)
}

/// Deletes `key` alone from the store, as `etcdctl del <key>` does.
pub(super) fn delete_key(world: &World, key: &str) {
    let mut state = world.cluster.shared.lock();
    let changes = state.store.delete_keys(&[key.as_bytes().to_vec()]);
    let revision = state.store.revision();
    state.watchers.notify(&changes, revision);
}

/// The lease `key` is bound to in the store now, if it exists.
pub(super) fn lease_of_key(world: &World, key: &[u8]) -> Option<i64> {
    let range = crate::support::kv::Range::key(key);
    let request = crate::transport::generated::etcdserverpb::RangeRequest {
        key: range.key,
        ..Default::default()
    };
    let state = world.cluster.shared.lock();
    let found = state.store.range(&request).ok()?;
    found.kvs.first().map(|kv| kv.lease)
}
