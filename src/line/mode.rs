//! How a key shares its name's line, read from the key's name: the flock model on one
//! line ordered by create revision.
//!
//! * **Exclusive** `<name>/<lease hex>`: Go's `Mutex` and `Election`, `etcdctl lock`, our
//!   `Mutex`, `Election` and `RwLock` writers. Waits for every older key.
//! * **Shared** `<name>/<lease hex>.shared`: `RwLock` readers. Wait only for older keys that
//!   are not shared, so readers in a row hold together, and a reader behind a writer waits
//!   for it (no writer starves).
//! * **Permits** `<name>/<lease hex>.permits-<N>`: one permit of a `Semaphore` of N, and
//!   `<name>/<lease hex>.permits-<N>.x<k>` (2 ≤ k ≤ N): k permits of it at once
//!   (`acquire_many`). A permit key of weight k waits for every older key that is not a
//!   permit of the same N, and holds while the weights of the older permits of N sum to at
//!   most N − k: the first permits in line whose weights fit in N hold, and no request
//!   overtakes an older one that waits (its weight counts against every younger one).
//!
//! Any other key under the name (data, a nested name, a future layout) counts as exclusive,
//! so every mode stays exclusive with the keys it does not understand. Go's `Mutex` counts
//! every key, so `etcdctl lock NAME` excludes readers and permits too. Why this is safe:
//! docs/design/permits.md.

use std::collections::{HashMap, HashSet};

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
    /// `Permits(n, k)`: k of the n permits of a semaphore (1 ≤ k ≤ n ≤ [`MAX_PERMITS`]).
    Permits(u32, u32),
}

const SHARED: &[u8] = b".shared";
const PERMITS: &[u8] = b".permits-";
/// Between a permit key's N and its weight k, when k > 1.
const TIMES: &[u8] = b".x";

/// A canonical decimal number (no sign, no leading zero, not empty), as `suffix` writes it.
fn canonical(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() || digits[0] == b'0' || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

impl Mode {
    /// What follows the lease id in the key's name. A single permit keeps the key of the
    /// versions before weights (`.permits-N`), so they count it as one permit, as we do.
    pub(crate) fn suffix(self) -> Vec<u8> {
        match self {
            Mode::Exclusive => Vec::new(),
            Mode::Shared => SHARED.to_vec(),
            Mode::Permits(n, 1) => [PERMITS, n.to_string().as_bytes()].concat(),
            Mode::Permits(n, k) => [
                PERMITS,
                n.to_string().as_bytes(),
                TIMES,
                k.to_string().as_bytes(),
            ]
            .concat(),
        }
    }

    /// How many permits a key of this mode takes: k for `Permits(_, k)`, else none.
    pub(crate) fn weight(self) -> Option<u32> {
        match self {
            Mode::Permits(_, k) => Some(k),
            Mode::Exclusive | Mode::Shared => None,
        }
    }

    /// How many permits `key`, a permit key of any name, takes: its suffix starts at the
    /// last `.permits-` (a lease id in hex has no dot).
    pub(crate) fn weight_of_permit_key(key: &[u8]) -> Option<u32> {
        let start = key.windows(PERMITS.len()).rposition(|w| w == PERMITS)?;
        Mode::of_suffix(&key[start..])?.weight()
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
        Mode::of_suffix(&rest[hex_len..])
    }

    /// The mode of a lock key whose name ends with `suffix` after the lease id.
    pub(crate) fn of_suffix(suffix: &[u8]) -> Option<Mode> {
        if suffix.is_empty() {
            return Some(Mode::Exclusive);
        }
        if suffix == SHARED {
            return Some(Mode::Shared);
        }
        let rest = suffix.strip_prefix(PERMITS)?;
        // Canonical decimal only, as `suffix` writes it: one spelling per key, and a weight
        // of 1 only in the key without one.
        let (n, k) = match rest.iter().position(|&b| b == b'.') {
            None => (canonical(rest)?, 1),
            Some(dot) => {
                let weight = canonical(rest[dot..].strip_prefix(TIMES)?)?;
                (canonical(&rest[..dot])?, (weight >= 2).then_some(weight)?)
            }
        };
        ((1..=MAX_PERMITS).contains(&n) && k <= n).then_some(Mode::Permits(n, k))
    }
}

/// The keys ahead of ours that matter to our mode: the ones that must all go (`blocking`),
/// and, for permits, the older permits of our N with their weights (`counted`), whose
/// weights must sum to less than `room` (N − k + 1 for a request of k permits).
#[derive(Debug, Clone)]
pub(crate) struct Sorted {
    pub(crate) blocking: HashSet<Vec<u8>>,
    pub(crate) counted: HashMap<Vec<u8>, u32>,
    pub(crate) room: usize,
    /// The sum of the weights in `counted`.
    weight: usize,
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
            counted: HashMap::new(),
            // k of N permits: the older permits' weights must sum to at most N − k.
            room: match self {
                Mode::Permits(n, k) => (n - k.min(n)) as usize + 1,
                _ => 1,
            },
            weight: 0,
        };
        for key in keys {
            match (self, Mode::of_key(prefix, &key)) {
                (Mode::Shared, Some(Mode::Shared)) => {}
                (Mode::Permits(n, _), Some(Mode::Permits(m, w))) if m == n => {
                    if sorted.counted.insert(key, w).is_none() {
                        sorted.weight += w as usize;
                    }
                }
                (Mode::Permits(n, _), Some(Mode::Permits(m, _))) => {
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
/// keys its mode passes (readers before a reader, permits of its N weighing at most N − k
/// before a permit of weight k, nothing before an exclusive key), and each of those holds
/// by the same rule. And a key that waits keeps every younger one waiting: a younger key
/// waits for whatever blocks it, and counts its weight on top of the older permits it
/// counts (more than N − k, so more than N − k' for any k' ≥ 1). So counting stops at the
/// first key that waits, and costs O(holders²) key comparisons.
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
    /// Whether these keys let us hold: none that blocks, and enough free permits (the
    /// older permits weigh less than `room`).
    pub(crate) fn is_clear(&self) -> bool {
        self.blocking.is_empty() && self.weight < self.room
    }

    pub(crate) fn len(&self) -> usize {
        self.blocking.len() + self.counted.len()
    }

    /// The sum of the weights of the permits counted.
    pub(crate) fn weight(&self) -> usize {
        self.weight
    }

    /// Crosses `key` off; returns whether it was one of ours to wait for.
    pub(crate) fn remove(&mut self, key: &[u8]) -> bool {
        if self.blocking.remove(key) {
            return true;
        }
        match self.counted.remove(key) {
            Some(w) => {
                self.weight -= w as usize;
                true
            }
            None => false,
        }
    }

    /// Every key we wait for.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.blocking.iter().chain(self.counted.keys())
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
            Mode::Permits(1, 1),
            Mode::Permits(4, 1),
            Mode::Permits(4, 2),
            Mode::Permits(4, 4),
            Mode::Permits(MAX_PERMITS, MAX_PERMITS),
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
            // Weights: canonical, 2 to N, only after a valid N.
            "n/694d.permits-4.x1",
            "n/694d.permits-4.x5",
            "n/694d.permits-4.x0",
            "n/694d.permits-4.x02",
            "n/694d.permits-4.x",
            "n/694d.permits-4.",
            "n/694d.permits-4.y2",
            "n/694d.permits-4.x2.x2",
            "n/694d.permits-04.x2",
            "n/694d.permits-1025.x2",
            "n/694d.shared.x2",
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
        let permits = Mode::Permits(2, 1).sort(b"n/", line).unwrap();
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
            Mode::Permits(2, 1)
                .sort(b"n/", two.clone())
                .unwrap()
                .is_clear()
        );
        let full = keys(&["n/1.permits-2", "n/2.permits-2"]);
        assert!(!Mode::Permits(2, 1).sort(b"n/", full).unwrap().is_clear());
        assert!(
            Mode::Permits(3, 1).sort(b"n/", two).is_err(),
            "sizes disagree"
        );
    }

    #[test]
    fn a_request_of_k_permits_waits_until_the_older_ones_weigh_at_most_n_minus_k() {
        let sort = |mode: Mode, line: &[&str]| mode.sort(b"n/", keys(line)).unwrap();
        // 4 permits: 1 + 2 older leave 1 free.
        let older = ["n/1.permits-4", "n/2.permits-4.x2"];
        assert!(sort(Mode::Permits(4, 1), &older).is_clear());
        assert!(!sort(Mode::Permits(4, 2), &older).is_clear());
        assert_eq!(sort(Mode::Permits(4, 2), &older).weight(), 3);
        assert!(sort(Mode::Permits(4, 4), &[]).is_clear());
        assert!(!sort(Mode::Permits(4, 4), &["n/1.permits-4"]).is_clear());
        // Crossing off a weighted key frees its whole weight.
        let mut ahead = sort(Mode::Permits(4, 3), &older);
        assert!(ahead.remove(b"n/2.permits-4.x2"));
        assert!(ahead.is_clear());
        assert!(!ahead.remove(b"n/2.permits-4.x2"), "crossed off once");
        assert_eq!(ahead.weight(), 1);
        // A weighted key of another N is a disagreement, as an unweighted one is.
        assert!(Mode::Permits(3, 2).sort(b"n/", keys(&older)).is_err());
        assert!(Mode::Permits(3, 1).sort(b"n/", keys(&older)).is_err());
        // Any other key still blocks as a whole.
        let mixed = sort(Mode::Permits(4, 1), &["n/1", "n/2.permits-4.x3"]);
        assert_eq!((mixed.blocking.len(), mixed.weight()), (1, 3));
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
            // Weights: in line order, no overtaking.
            (&["n/1.permits-4.x3", "n/2.permits-4", "n/3.permits-4"], 2),
            (&["n/1.permits-4", "n/2.permits-4.x3", "n/3.permits-4"], 2),
            (
                &[
                    "n/1.permits-4",
                    "n/2.permits-4",
                    "n/3.permits-4.x3",
                    "n/4.permits-4",
                ],
                2,
            ),
            (&["n/1.permits-4.x4", "n/2.permits-4"], 1),
            (
                &["n/1.permits-4.x2", "n/2.permits-4.x2", "n/3.permits-4"],
                2,
            ),
            (&["n/1.permits-4.x2", "n/2.permits-3.x2"], 1),
        ];
        for (line, holders) in cases {
            assert_eq!(holding(b"n/", &keys(line)), *holders, "{line:?}");
        }
    }
}
