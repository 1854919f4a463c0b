//! The opt-in deadlock check of a wait (`ClientBuilder::deadlock_detection`): beside a
//! wait for a name under the client's prefix, read the prefix's wait graph (one Range:
//! `line/names.rs`), find its cycles (`line/cycles.rs`) and end the wait with
//! `Deadlock` if it is the one wait of a cycle chosen to end: the one whose key is
//! youngest (highest create revision). Every waiter applies the same rule to what it
//! reads, so of the waits on one cycle only that one ends; the others wait on, and go on
//! once it has let go. Checked at once (the read follows our enqueue, so its revision is
//! past our key's), which is when most cycles are seen: the youngest key of a cycle is a
//! wait (every key a wait waits behind is older), so the cycle was complete once it joined.
//! Then checked again after a pause ([`recheck_after`]: 1 s, longer for a long prefix):
//! a cycle can also close later, when a stuck session gives up and a wait behind it now
//! waits for the next, or by an acquisition on another thread of a waiting session.
//!
//! Never a false alarm about the cycle: a cycle found in a read at revision R existed at
//! R (each session on it waited, at R, for a name the next one held, or was ahead of it
//! in once every session that can go on has let go). It ends a wait only if a second
//! read [`CONFIRM`] later shows it again, and not if it runs through what the library
//! undoes by itself: a session behind its own key, a multi-lock's keys past the name it
//! waits for, a key of our own session that no live hold here uses (a release or cleanup
//! still due). What the check cannot see is threads (a session is one party: see `Cycle`)
//! and another process's keys on their way out.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::Place;

use crate::line::cycles::{self, Line};
use crate::line::mode::{self, Mode};
use crate::line::names;
use crate::line::queue::Ours;
use crate::support::error::cycle::{Cycle, CycleStep};
use crate::support::error::{Error, Result};
use crate::support::kv::{KeyValue, text};
use crate::transport::Rpc;

/// How often a wait checks again while it waits, at most: one Range of the prefix each
/// time. A prefix with many keys is read less often ([`recheck_after`]).
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// The longest pause between two checks of one wait.
pub(crate) const MAX_RECHECK: Duration = Duration::from_secs(10);

/// The pause before a wait's next check after a read of `keys` keys: [`RECHECK`], or 10 ms
/// a key when that is longer (so each waiter reads at most about 100 keys a second), up
/// to [`MAX_RECHECK`]: 1 s up to 100 keys, 10 s from 1,000.
pub(crate) fn recheck_after(keys: usize) -> Duration {
    let per_key = Duration::from_millis(10).saturating_mul(u32::try_from(keys).unwrap_or(u32::MAX));
    per_key.clamp(RECHECK, MAX_RECHECK)
}

/// The check for the wait of `line`'s key created at `rev`, if the client has it on and
/// the name lies under its prefix (the graph holds a name whose `<name>/` starts with it).
pub(super) fn watch_if_on(
    rpc: &Rpc,
    line: &Arc<Place>,
    rev: i64,
) -> Option<impl Future<Output = Error>> {
    let prefix = rpc.deadlock_prefix()?;
    line.prefix()
        .starts_with(prefix)
        .then(|| watch(rpc, prefix, line, line.ours(rev)))
}

/// Whether this process uses our key `key` (created at `rev`) in the line of `name`: a
/// live hold of our session has it. A key of ours that nobody here holds is on its way
/// out (a release or cleanup whose answer is still due, a leftover of an earlier life of
/// the lease), and a cycle through it is undone without any wait ending.
fn held_here(line: &Place, name: &[u8], key: &[u8], rev: i64) -> bool {
    let prefix = [name, b"/"].concat();
    let Some(mode) = Mode::of_key(&prefix, key) else {
        return false;
    };
    Place::of(line.session(), name, mode)
        .ok()
        .and_then(|place| place.live_hold())
        .is_some_and(|hold| hold.rev == rev)
}

/// How long after a first sight of a cycle it is read again: only a cycle seen in two
/// reads (the same sessions, names and waiting keys) ends a wait. What the library undoes
/// by itself (a cleanup of a wait that already ended, running in the background) is gone
/// by then.
pub(crate) const CONFIRM: Duration = Duration::from_millis(250);

/// A cycle as one check saw it: its steps, each step's waiting key, the revision read.
type Seen = (Cycle, Vec<Vec<u8>>, i64);

/// Our keys that a wait of the cycle waits behind: (name, key, create revision).
type Ahead = Vec<(Vec<u8>, Vec<u8>, i64)>;

/// Checks now, then after every pause ([`recheck_after`]): ends only with the `Deadlock`
/// of a cycle this wait is chosen to end, seen in two reads [`CONFIRM`] apart. A read that
/// fails for a passing reason is skipped; any other failure (a refusal of the prefix)
/// turns the check off for this wait, with a warning: the wait itself goes on, as without
/// the option.
async fn watch(rpc: &Rpc, prefix: &[u8], line: &Place, ours: Ours<'_>) -> Error {
    let lease = line.session().lease_id();
    let mut first: Option<Seen> = None;
    loop {
        let mut pause = RECHECK;
        match check(rpc, prefix, lease, ours).await {
            // A key of ours the others wait behind that nobody here holds: on its way out
            // (or a leftover nobody here will remove: then read at the usual pace).
            Ok((Some((_, _, _, ahead)), read))
                if !ahead
                    .iter()
                    .all(|(name, key, rev)| held_here(line, name, key, *rev)) =>
            {
                tracing::debug!(key = %text(ours.key), "a cycle through a key of ours on its way out");
                first = None;
                pause = recheck_after(read);
            }
            Ok((Some((cycle, keys, revision, _)), _)) => match first.take() {
                Some((first_cycle, first_keys, _))
                    if first_cycle == cycle && first_keys == keys =>
                {
                    tracing::info!(key = %text(ours.key), revision, %cycle, "deadlock: this wait ends");
                    return Error::Deadlock { cycle, revision };
                }
                _ => {
                    tracing::debug!(key = %text(ours.key), %cycle, "a cycle: reading again");
                    first = Some((cycle, keys, revision));
                    pause = CONFIRM;
                }
            },
            Ok((None, keys)) => {
                first = None;
                pause = recheck_after(keys);
            }
            Err(e) if e.is_transient() => {
                tracing::debug!(error = %e, "deadlock check: read failed; reading again later");
            }
            Err(e) => {
                tracing::warn!(error = %e, prefix = %text(prefix), "deadlock check off for this wait: the prefix cannot be read");
                return std::future::pending().await;
            }
        }
        tokio::time::sleep(pause).await;
    }
}

/// One check: the cycle this wait must end, with its waiting keys and the revision it was
/// read at (`None` when no cycle has it as the one to end); with how many keys were read.
async fn check(
    rpc: &Rpc,
    prefix: &[u8],
    lease: i64,
    ours: Ours<'_>,
) -> Result<(Option<(Cycle, Vec<Vec<u8>>, i64, Ahead)>, usize)> {
    // With the values: etcd 3.7 leaves the lease out of a keys-only answer.
    let read = rpc.read(&names::read_of(prefix)).await?;
    let read_keys = read.kvs.len();
    let seen = chosen(prefix, read.kvs, lease, ours)
        .map(|(cycle, keys, ahead)| (cycle, keys, read.revision, ahead));
    Ok((seen, read_keys))
}

/// Of the cycles in `kvs` (every key under `prefix`, oldest first), one whose wait to end
/// is ours (`ours`, a key of `lease`): with each step's waiting key. A step's waiting key
/// is its session's youngest key in the name that does not hold; the wait to end is the
/// step whose waiting key is youngest (ties, which one Txn's keys of two names of one
/// session could make, go to the higher lease; two steps are two sessions).
///
/// Left out, as what the library undoes by itself without any wait ending: a session
/// behind its own key (a leftover of an earlier life of its lease, removed in the
/// background: `leftover.rs`; the same thread waiting on its own hold is `WouldDeadlock`),
/// and the keys a multi-lock put on the names after the first one it waits for (`many.rs`:
/// removed before its wait starts), known by their create revision, the one of its
/// waiting key.
fn chosen(
    prefix: &[u8],
    kvs: Vec<KeyValue>,
    lease: i64,
    ours: Ours<'_>,
) -> Option<(Cycle, Vec<Vec<u8>>, Ahead)> {
    let lines = without_passing_keys(names::lines(prefix, kvs));
    let found = cycles::search(
        lines
            .iter()
            .map(|(name_prefix, kvs, _)| Line {
                prefix: name_prefix.clone(),
                keys: kvs.iter().map(|kv| (kv.key.clone(), kv.lease)).collect(),
            })
            .collect(),
    );
    for ring in found.cycles {
        if ring.len() < 2 || !ring.iter().any(|&(l, _, _)| l == lease) {
            continue;
        }
        let waiting: Option<Vec<&KeyValue>> = ring
            .iter()
            .map(|&(l, i, _)| {
                let (_, kvs, holding) = &lines[i];
                kvs[(*holding).min(kvs.len())..]
                    .iter()
                    .filter(|kv| kv.lease == l)
                    .max_by_key(|kv| kv.create_revision)
            })
            .collect();
        let Some(waiting) = waiting else { continue };
        let youngest = waiting
            .iter()
            .zip(&ring)
            .max_by_key(|(kv, (l, _, _))| (kv.create_revision, *l))
            .map(|(kv, _)| *kv);
        if youngest.is_some_and(|kv| kv.key == ours.key && kv.create_revision == ours.rev) {
            // Who waits: the value of its waiting key (a session's identity).
            let identity = |kv: &KeyValue| {
                (!kv.value.is_empty())
                    .then(|| String::from_utf8(kv.value.clone()).ok())
                    .flatten()
            };
            let cycle = Cycle {
                steps: ring
                    .iter()
                    .zip(&waiting)
                    .map(|(&(l, i, holder), kv)| CycleStep {
                        lease: l,
                        name: lines[i].0[..lines[i].0.len() - 1].to_vec(),
                        holder,
                        identity: identity(kv),
                    })
                    .collect(),
            };
            // Our keys ahead of each wait that waits for us.
            let mut ahead = Ahead::new();
            for (&(_, i, holder), kv) in ring.iter().zip(&waiting) {
                if holder != lease {
                    continue;
                }
                let (name_prefix, kvs, holding) = &lines[i];
                let name = &name_prefix[..name_prefix.len() - 1];
                for mine in kvs[..(*holding).min(kvs.len())].iter() {
                    if mine.lease == lease && mine.create_revision < kv.create_revision {
                        ahead.push((name.to_vec(), mine.key.clone(), mine.create_revision));
                    }
                }
            }
            let keys = waiting.into_iter().map(|kv| kv.key.clone()).collect();
            return Some((cycle, keys, ahead));
        }
    }
    None
}

/// `lines` without the keys a multi-lock put on names after the first one it waits for
/// (same lease, same create revision, a later name), each line's holders counted again.
fn without_passing_keys(
    lines: Vec<(Vec<u8>, Vec<KeyValue>, usize)>,
) -> Vec<(Vec<u8>, Vec<KeyValue>, usize)> {
    // The first name (bytewise, as a multi-lock takes them) each (lease, revision) waits in.
    let name = |prefix: &[u8]| prefix[..prefix.len().saturating_sub(1)].to_vec();
    let mut first_wait: HashMap<(i64, i64), Vec<u8>> = HashMap::new();
    for (prefix, kvs, holding) in &lines {
        for kv in kvs.iter().skip(*holding).filter(|kv| kv.lease != 0) {
            let at = first_wait
                .entry((kv.lease, kv.create_revision))
                .or_insert_with(|| name(prefix));
            if name(prefix) < *at {
                *at = name(prefix);
            }
        }
    }
    lines
        .into_iter()
        .map(|(prefix, kvs, holding)| {
            let here = name(&prefix);
            let passing = |kv: &KeyValue| {
                first_wait
                    .get(&(kv.lease, kv.create_revision))
                    .is_some_and(|first| here > *first)
            };
            if !kvs.iter().any(passing) {
                return (prefix, kvs, holding);
            }
            let kvs: Vec<KeyValue> = kvs.into_iter().filter(|kv| !passing(kv)).collect();
            let keys: Vec<Vec<u8>> = kvs.iter().map(|kv| kv.key.clone()).collect();
            let holding = mode::holding(&prefix, &keys);
            (prefix, kvs, holding)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::line::mode::Mode;

    /// A key `<name>/<lease hex>` created at `rev`.
    fn kv(name: &str, lease: i64, rev: i64) -> KeyValue {
        KeyValue {
            key: format!("{name}/{lease:x}").into_bytes(),
            lease,
            create_revision: rev,
            mod_revision: rev,
            ..KeyValue::default()
        }
    }

    fn ours(key: &[u8], rev: i64) -> Ours<'_> {
        let slash = key.iter().rposition(|&b| b == b'/').unwrap_or(0);
        Ours {
            prefix: &key[..=slash],
            key,
            mode: Mode::Exclusive,
            rev,
        }
    }

    fn by_rev(mut kvs: Vec<KeyValue>) -> Vec<KeyValue> {
        kvs.sort_by_key(|kv| kv.create_revision);
        kvs
    }

    #[test]
    fn only_the_youngest_wait_of_a_cycle_ends() {
        // a holds x (2), b holds y (3); b waits for x (4), a waits for y (5): a's is youngest.
        let kvs = by_rev(vec![
            kv("x", 0xa, 2),
            kv("y", 0xb, 3),
            kv("x", 0xb, 4),
            kv("y", 0xa, 5),
        ]);
        let a = chosen("".as_bytes(), kvs.clone(), 0xa, ours(b"y/a", 5));
        let (cycle, keys, ahead) = a.expect("a's wait closes the cycle");
        assert_eq!(ahead, [(b"x".to_vec(), b"x/a".to_vec(), 2)]);
        assert_eq!(
            cycle.to_string(),
            "a waits for y held by b; b waits for x held by a"
        );
        assert_eq!(keys, [b"y/a".to_vec(), b"x/b".to_vec()]);
        assert!(chosen(b"", kvs.clone(), 0xb, ours(b"x/b", 4)).is_none());
        // A stale revision of our key is not ours.
        assert!(chosen(b"", kvs, 0xa, ours(b"y/a", 9)).is_none());
    }

    #[test]
    fn a_chain_or_a_name_outside_the_prefix_is_no_deadlock() {
        // c holds z; b holds y, waits for z; a holds x, waits for y.
        let kvs = by_rev(vec![
            kv("z", 0xc, 2),
            kv("y", 0xb, 3),
            kv("x", 0xa, 4),
            kv("z", 0xb, 5),
            kv("y", 0xa, 6),
        ]);
        for (lease, key, rev) in [(0xa, &b"y/a"[..], 6), (0xb, b"z/b", 5)] {
            assert!(chosen(b"", kvs.clone(), lease, ours(key, rev)).is_none());
        }
        // The cycle of x and y, read under "p/" only: no name in it.
        let kvs = by_rev(vec![
            kv("x", 0xa, 2),
            kv("y", 0xb, 3),
            kv("x", 0xb, 4),
            kv("y", 0xa, 5),
        ]);
        assert!(chosen(b"p/", kvs, 0xa, ours(b"y/a", 5)).is_none());
    }

    #[test]
    fn a_session_behind_its_own_key_or_a_multi_locks_passing_key_is_no_deadlock() {
        // a's leftover writer key in r, ahead of its own reader: removed in the background.
        let mut shared = kv("r", 0xa, 3);
        shared.key = b"r/a.shared".to_vec();
        let kvs = vec![kv("r", 0xa, 2), shared];
        assert!(chosen(b"", kvs, 0xa, ours(b"r/a.shared", 3)).is_none());
        // b holds m and waits for r; a's multi-lock of {m, r} put both keys at 4: it waits
        // in m and its key in r (ahead of b's) is removed before its wait starts.
        let kvs = by_rev(vec![
            kv("m", 0xb, 2),
            kv("m", 0xa, 4),
            kv("r", 0xa, 4),
            kv("r", 0xb, 5),
        ]);
        assert!(chosen(b"", kvs.clone(), 0xb, ours(b"r/b", 5)).is_none());
        assert!(chosen(b"", kvs, 0xa, ours(b"m/a", 4)).is_none());
        // The same keys from two Txns are a deadlock: a holds r, and waits for m.
        let kvs = by_rev(vec![
            kv("m", 0xb, 2),
            kv("r", 0xa, 3),
            kv("m", 0xa, 4),
            kv("r", 0xb, 5),
        ]);
        assert!(chosen(b"", kvs, 0xb, ours(b"r/b", 5)).is_some());
    }

    #[test]
    fn a_multi_locks_keys_past_the_first_name_it_waits_in_are_dropped() {
        // c holds m, d holds r; a's multi-lock of {m, r} put m/a and r/a at 4: it waits in
        // m (the first name, bytewise), and r/a is on its way out. In either order.
        let m = (b"m/".to_vec(), vec![kv("m", 0xc, 2), kv("m", 0xa, 4)], 1);
        let r = (b"r/".to_vec(), vec![kv("r", 0xd, 3), kv("r", 0xa, 4)], 1);
        let kept = |lines: Vec<(Vec<u8>, Vec<KeyValue>, usize)>| {
            let mut kept: Vec<(Vec<u8>, Vec<Vec<u8>>, usize)> = without_passing_keys(lines)
                .into_iter()
                .map(|(prefix, kvs, holding)| {
                    (prefix, kvs.into_iter().map(|kv| kv.key).collect(), holding)
                })
                .collect();
            kept.sort();
            kept
        };
        let expected = vec![
            (b"m/".to_vec(), vec![b"m/c".to_vec(), b"m/a".to_vec()], 1),
            (b"r/".to_vec(), vec![b"r/d".to_vec()], 1),
        ];
        assert_eq!(kept(vec![m.clone(), r.clone()]), expected);
        assert_eq!(kept(vec![r, m]), expected);
    }

    #[test]
    fn of_a_shared_line_only_our_own_holds_are_ours_ahead() {
        // a and x read s (2, 3); b holds m (4) and waits to write s (5); x (6) and a (7)
        // wait for m. a's wait is youngest; b waits behind both readers, but of them only
        // a's key is ours: x's is no key on its way out here.
        let shared = |lease: i64, rev: i64| {
            let mut kv = kv("s", lease, rev);
            kv.key = format!("s/{lease:x}.shared").into_bytes();
            kv
        };
        let kvs = by_rev(vec![
            shared(0xa, 2),
            shared(0x1f, 3),
            kv("m", 0xb, 4),
            kv("s", 0xb, 5),
            kv("m", 0x1f, 6),
            kv("m", 0xa, 7),
        ]);
        let (cycle, keys, ahead) = chosen(b"", kvs, 0xa, ours(b"m/a", 7)).expect("a's wait ends");
        assert_eq!(ahead, [(b"s".to_vec(), b"s/a.shared".to_vec(), 2)]);
        assert_eq!(keys, [b"m/a".to_vec(), b"s/b".to_vec()]);
        assert_eq!(
            cycle.to_string(),
            "a waits for m held by b; b waits for s held by a"
        );
    }

    #[test]
    fn a_long_prefix_is_read_less_often() {
        assert_eq!(recheck_after(0), RECHECK);
        assert_eq!(recheck_after(100), RECHECK);
        assert_eq!(recheck_after(250), Duration::from_millis(2500));
        assert_eq!(recheck_after(1000), MAX_RECHECK);
        assert_eq!(recheck_after(usize::MAX), MAX_RECHECK);
    }

    #[test]
    fn three_in_a_ring_end_the_youngest() {
        // a holds x, b holds y, c holds z; a waits y, b waits z, c waits x (youngest).
        let kvs = by_rev(vec![
            kv("x", 0xa, 2),
            kv("y", 0xb, 3),
            kv("z", 0xc, 4),
            kv("y", 0xa, 5),
            kv("z", 0xb, 6),
            kv("x", 0xc, 7),
        ]);
        let (cycle, _, _) = chosen(b"", kvs.clone(), 0xc, ours(b"x/c", 7)).expect("c ends");
        assert_eq!(cycle.leases().collect::<Vec<_>>(), [0xa, 0xb, 0xc]);
        assert!(chosen(b"", kvs.clone(), 0xa, ours(b"y/a", 5)).is_none());
        assert!(chosen(b"", kvs, 0xb, ours(b"z/b", 6)).is_none());
    }

    #[test]
    fn a_cycle_through_a_go_lock_on_the_empty_name_is_found() {
        // No recipe of ours takes the empty name, Go's does (keys `/<lease>`): a holds x,
        // c holds y, b holds ""; b waits for x, c waits for "", a waits for y (youngest).
        let kvs = by_rev(vec![
            kv("x", 0xa, 2),
            kv("y", 0xc, 3),
            kv("", 0xb, 4),
            kv("x", 0xb, 5),
            kv("", 0xc, 6),
            kv("y", 0xa, 7),
        ]);
        let (cycle, _, _) = chosen(b"", kvs, 0xa, ours(b"y/a", 7)).expect("a ends");
        let mut leases: Vec<i64> = cycle.leases().collect();
        leases.sort_unstable();
        assert_eq!(leases, [0xa, 0xb, 0xc]);
    }
}
