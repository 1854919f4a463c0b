//! How a key shares its name's line, read from the key's name: the flock model on one
//! line ordered by create revision.
//!
//! * **Exclusive** `<name>/<lease hex>`: Go's `Mutex` and `Election`, `etcdctl lock`, our
//!   `Mutex`, `Election` and `RwLock` writers. Waits for every older key.
//! * **Shared** `<name>/<lease hex>.shared`: `RwLock` readers. Wait only for older keys that
//!   are not shared, so readers in a row hold together, and a reader behind a writer waits
//!   for it (no writer starves).
//! * **Permits** `<name>/<lease hex>.permits-<N>`: a `Semaphore` of N. Waits for every older
//!   key that is not a permit of the same N, and holds while fewer than N older permits
//!   exist: the first N permits hold.
//!
//! Any other key under the name (data, a nested name, a future layout) counts as exclusive,
//! so every mode stays exclusive with the keys it does not understand. Go's `Mutex` counts
//! every key, so `etcdctl lock NAME` excludes readers and permits too. Why this is safe:
//! ARCHITECTURE.md, "Shared keys and permits".

use std::collections::HashSet;

use crate::support::kv::text;

/// The most permits a [`Semaphore`](crate::Semaphore) may have (1,024): a waiter then
/// knows whether it holds from the newest keys ahead of it that one read returns.
///
/// ```
/// assert_eq!(etcd_sync::MAX_PERMITS, 1024);
/// ```
pub const MAX_PERMITS: u32 = 1024;

/// How a key shares the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Mode {
    Exclusive,
    Shared,
    Permits(u32),
}

const SHARED: &[u8] = b".shared";
const PERMITS: &[u8] = b".permits-";

impl Mode {
    /// What follows the lease id in the key's name.
    pub(crate) fn suffix(self) -> Vec<u8> {
        match self {
            Mode::Exclusive => Vec::new(),
            Mode::Shared => SHARED.to_vec(),
            Mode::Permits(n) => [PERMITS, n.to_string().as_bytes()].concat(),
        }
    }

    /// The lease id in `key` under `prefix`, if it is a lock key (see [`Mode::of_key`]).
    pub(crate) fn lease_of(prefix: &[u8], key: &[u8]) -> Option<i64> {
        Mode::of_key(prefix, key)?;
        let rest = key.strip_prefix(prefix)?;
        let hex: Vec<u8> = rest
            .iter()
            .copied()
            .take_while(u8::is_ascii_hexdigit)
            .collect();
        u64::from_str_radix(std::str::from_utf8(&hex).ok()?, 16)
            .ok()
            .map(|id| id as i64)
    }

    /// The mode of `key` under `prefix`, if it has the shape of a key a lock, campaign,
    /// reader or semaphore created (`<prefix><lease hex><suffix>`); `None` for any other
    /// key (data, a nested name).
    pub(crate) fn of_key(prefix: &[u8], key: &[u8]) -> Option<Mode> {
        let rest = key.strip_prefix(prefix)?;
        let hex_len = rest
            .iter()
            .take_while(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            .count();
        if !(1..=16).contains(&hex_len) {
            return None;
        }
        let suffix = &rest[hex_len..];
        if suffix.is_empty() {
            return Some(Mode::Exclusive);
        }
        if suffix == SHARED {
            return Some(Mode::Shared);
        }
        let digits = suffix.strip_prefix(PERMITS)?;
        // Canonical decimal only, as `suffix` writes it.
        if digits.is_empty() || digits[0] == b'0' || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n: u32 = std::str::from_utf8(digits).ok()?.parse().ok()?;
        (1..=MAX_PERMITS).contains(&n).then_some(Mode::Permits(n))
    }
}

/// The keys ahead of ours that matter to our mode: the ones that must all go (`blocking`),
/// and, for permits, the older permits of which fewer than `room` may remain.
#[derive(Debug, Clone)]
pub(crate) struct Sorted {
    pub(crate) blocking: HashSet<Vec<u8>>,
    pub(crate) counted: HashSet<Vec<u8>>,
    pub(crate) room: usize,
}

/// Another participant uses the same name as a semaphore of a different size.
#[derive(Debug, Clone)]
pub(crate) struct Disagreement(pub(crate) String);

impl Mode {
    /// Sorts the keys ahead of ours (`keys`, under `prefix`) by what they mean to us.
    pub(crate) fn sort(
        self,
        prefix: &[u8],
        keys: impl IntoIterator<Item = Vec<u8>>,
    ) -> Result<Sorted, Disagreement> {
        let mut sorted = Sorted {
            blocking: HashSet::new(),
            counted: HashSet::new(),
            room: match self {
                Mode::Permits(n) => n as usize,
                _ => 1,
            },
        };
        for key in keys {
            match (self, Mode::of_key(prefix, &key)) {
                (Mode::Shared, Some(Mode::Shared)) => {}
                (Mode::Permits(n), Some(Mode::Permits(m))) if m == n => {
                    sorted.counted.insert(key);
                }
                (Mode::Permits(n), Some(Mode::Permits(m))) => {
                    return Err(Disagreement(format!(
                        "semaphore {:?} has {n} permits here, but {:?} was acquired with \
                         {m}: every participant must use the same number of permits",
                        text(&prefix[..prefix.len().saturating_sub(1)]),
                        text(&key),
                    )));
                }
                _ => {
                    sorted.blocking.insert(key);
                }
            }
        }
        Ok(sorted)
    }
}

/// How many keys of `line` (every key under `prefix`, oldest create revision first) hold
/// now, by the rule each key's own waiter applies ([`Mode::sort`], [`Sorted::is_clear`]):
/// a key that is not a lock key counts as exclusive, and a permit whose N disagrees with
/// an older permit's does not hold (its waiter is refused).
///
/// The holders are always the first keys of the line: a key that holds has before it only
/// keys its mode passes (readers before a reader, fewer than N permits of its N before a
/// permit, nothing before an exclusive key), and each of those holds by the same rule.
/// So counting stops at the first key that waits, and costs O(holders²) key comparisons.
pub(crate) fn holding(prefix: &[u8], line: &[Vec<u8>]) -> usize {
    line.iter()
        .enumerate()
        .take_while(|&(i, key)| {
            let mode = Mode::of_key(prefix, key).unwrap_or(Mode::Exclusive);
            mode.sort(prefix, line[..i].iter().cloned())
                .is_ok_and(|ahead| ahead.is_clear())
        })
        .count()
}

impl Sorted {
    /// Whether these keys let us hold: none that blocks, and a free permit.
    pub(crate) fn is_clear(&self) -> bool {
        self.blocking.is_empty() && self.counted.len() < self.room
    }

    pub(crate) fn len(&self) -> usize {
        self.blocking.len() + self.counted.len()
    }

    /// Crosses `key` off; returns whether it was one of ours to wait for.
    pub(crate) fn remove(&mut self, key: &[u8]) -> bool {
        self.blocking.remove(key) || self.counted.remove(key)
    }

    /// Every key we wait for.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.blocking.iter().chain(&self.counted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_come_from_lock_keys_only() {
        assert_eq!(
            Mode::lease_of(b"n/", b"n/694d7a3c1f2b"),
            Some(0x694d_7a3c_1f2b)
        );
        assert_eq!(Mode::lease_of(b"n/", b"n/ff.shared"), Some(0xff));
        assert_eq!(Mode::lease_of(b"n/", b"n/ff.permits-3"), Some(0xff));
        assert_eq!(Mode::lease_of(b"n/", b"n/ffffffffffffffff"), Some(-1));
        assert_eq!(Mode::lease_of(b"n/", b"n/data"), None);
        assert_eq!(Mode::lease_of(b"n/", b"m/ff"), None);
    }

    fn keys(names: &[&str]) -> Vec<Vec<u8>> {
        names.iter().map(|n| n.as_bytes().to_vec()).collect()
    }

    #[test]
    fn suffixes_round_trip() {
        for mode in [
            Mode::Exclusive,
            Mode::Shared,
            Mode::Permits(1),
            Mode::Permits(4),
        ] {
            let key = [b"n/694d82254d5fa305".as_slice(), &mode.suffix()].concat();
            assert_eq!(Mode::of_key(b"n/", &key), Some(mode), "{}", text(&key));
        }
        for foreign in [
            "n/data",
            "n/nested/694d",
            "n/694d.permits-0",
            "n/694d.permits-04",
            "n/694d.permits-1025",
            "n/694d.permits-",
            "n/694d.shared2",
            "n/694D",
            "n/",
            "n/694d82254d5fa3051",
        ] {
            assert_eq!(Mode::of_key(b"n/", foreign.as_bytes()), None, "{foreign}");
        }
    }

    #[test]
    fn each_mode_waits_for_what_it_must() {
        let line = keys(&["n/1", "n/2.shared", "n/3.permits-2", "n/x"]);
        let exclusive = Mode::Exclusive.sort(b"n/", line.clone()).unwrap();
        assert_eq!(exclusive.blocking.len(), 4);
        let shared = Mode::Shared.sort(b"n/", line.clone()).unwrap();
        assert_eq!(shared.blocking.len(), 3, "a reader passes only readers");
        let permits = Mode::Permits(2).sort(b"n/", line).unwrap();
        assert_eq!((permits.blocking.len(), permits.counted.len()), (3, 1));
        // Readers in a row hold together; permits hold while fewer than N are older.
        assert!(
            Mode::Shared
                .sort(b"n/", keys(&["n/1.shared", "n/2.shared"]))
                .unwrap()
                .is_clear()
        );
        let two = keys(&["n/1.permits-2"]);
        assert!(
            Mode::Permits(2)
                .sort(b"n/", two.clone())
                .unwrap()
                .is_clear()
        );
        let full = keys(&["n/1.permits-2", "n/2.permits-2"]);
        assert!(!Mode::Permits(2).sort(b"n/", full).unwrap().is_clear());
        assert!(Mode::Permits(3).sort(b"n/", two).is_err(), "sizes disagree");
    }

    #[test]
    fn the_first_keys_that_their_own_rule_lets_in_hold() {
        let cases: &[(&[&str], usize)] = &[
            (&[], 0),
            (&["n/1", "n/2"], 1),
            (&["n/1.shared", "n/2.shared", "n/3", "n/4.shared"], 2),
            (&["n/1", "n/2.shared"], 1),
            (&["n/1.permits-2", "n/2.permits-2", "n/3.permits-2"], 2),
            (&["n/1.permits-3", "n/2.permits-2", "n/3.permits-3"], 1),
            (&["n/data", "n/1"], 1),
            (&["n/1.shared", "n/data"], 1),
        ];
        for (line, holders) in cases {
            assert_eq!(holding(b"n/", &keys(line)), *holders, "{line:?}");
        }
    }
}
