//! Which sessions can never go on, and the cycles among them, from the lines of a wait
//! graph. A session goes on when every lock key of it that waits would hold; it is then
//! assumed to let go of everything it holds in the end. So: repeatedly take a session
//! with no wait left, remove its keys from every line, and count again who holds
//! ([`mode::holding`], the rule each waiter applies: readers share, permits count their
//! weights); a key that now holds is no longer a wait of its session. The sessions left
//! with waits are stuck (deadlock detection by graph reduction, as for resources of
//! several units: a semaphore's waiter is stuck only if enough of its holders are).
//! Among the stuck ones, each waits for the holders of its names in the lines as they
//! are then; a ring of such edges is a cycle. Keys without a lease never go away, and a
//! key that is not a lock key (data under a name) waits for nothing.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use crate::line::mode::{self, Mode};

/// One name's line: its prefix (`<name>/`) and its keys, oldest first, with their leases.
pub(crate) struct Line {
    pub(crate) prefix: Vec<u8>,
    pub(crate) keys: Vec<(Vec<u8>, i64)>,
}

/// What [`search`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Found {
    /// The sessions that can never go on.
    pub(crate) stuck: BTreeSet<i64>,
    /// Each cycle as its steps: (waiting lease, index of the line it waits in, the next
    /// lease), starting at its lowest lease.
    pub(crate) cycles: Vec<Vec<(i64, usize, i64)>>,
}

/// Whether a key of `lease` in line `prefix` can wait: a lock key of a lease.
fn waits(prefix: &[u8], key: &[u8], lease: i64) -> bool {
    lease != 0 && Mode::of_key(prefix, key).is_some()
}

fn holding(line: &Line) -> usize {
    let keys: Vec<Vec<u8>> = line.keys.iter().map(|(key, _)| key.clone()).collect();
    mode::holding(&line.prefix, &keys)
}

/// The stuck sessions of `lines` and the cycles among them.
pub(crate) fn search(mut lines: Vec<Line>) -> Found {
    // Each lease's waits, as (line, key), and the lines each lease has keys in.
    let mut waiting: HashMap<i64, HashSet<(usize, Vec<u8>)>> = HashMap::new();
    let mut lines_of: HashMap<i64, BTreeSet<usize>> = HashMap::new();
    for (i, line) in lines.iter().enumerate() {
        let holds = holding(line);
        for (at, (key, lease)) in line.keys.iter().enumerate() {
            if *lease == 0 {
                continue;
            }
            lines_of.entry(*lease).or_default().insert(i);
            let waits_here = at >= holds && waits(&line.prefix, key, *lease);
            let entry = waiting.entry(*lease).or_default();
            if waits_here {
                entry.insert((i, key.clone()));
            }
        }
    }
    let mut free: VecDeque<i64> = {
        let mut idle: Vec<i64> = waiting
            .iter()
            .filter(|(_, w)| w.is_empty())
            .map(|(&lease, _)| lease)
            .collect();
        idle.sort_unstable();
        idle.into()
    };
    let mut gone: HashSet<i64> = HashSet::new();
    while let Some(lease) = free.pop_front() {
        if !gone.insert(lease) {
            continue;
        }
        for &i in lines_of.get(&lease).into_iter().flatten() {
            let line = &mut lines[i];
            line.keys.retain(|(_, l)| *l != lease);
            let holds = holding(line);
            for (key, other) in &line.keys[..holds] {
                if let Some(w) = waiting.get_mut(other)
                    && w.remove(&(i, key.clone()))
                    && w.is_empty()
                {
                    free.push_back(*other);
                }
            }
        }
    }
    // Every lease whose waits all ended went through `free` into `gone`, and a lease in
    // `gone` has none left: the stuck are those with a wait left.
    let stuck: BTreeSet<i64> = waiting
        .iter()
        .filter(|(_, w)| !w.is_empty())
        .map(|(&lease, _)| lease)
        .collect();

    // Edges among the stuck: a wait in line i → each stuck holder of line i now.
    let mut edges: HashMap<i64, Vec<(usize, i64)>> = HashMap::new();
    for &lease in &stuck {
        let mut out: BTreeSet<(i64, usize)> = BTreeSet::new();
        for (i, _) in &waiting[&lease] {
            let line = &lines[*i];
            for (_, holder) in &line.keys[..holding(line)] {
                if stuck.contains(holder) {
                    out.insert((*holder, *i));
                }
            }
        }
        // One line per holder (the first), ordered by holder.
        let mut seen = HashSet::new();
        let list = out
            .into_iter()
            .filter(|(holder, _)| seen.insert(*holder))
            .map(|(holder, i)| (i, holder))
            .collect();
        edges.insert(lease, list);
    }

    // For each stuck session not yet on a cycle, lowest first: the shortest cycle through it.
    let mut on_cycle: HashSet<i64> = HashSet::new();
    let mut cycles = Vec::new();
    for &start in &stuck {
        if on_cycle.contains(&start) {
            continue;
        }
        if let Some(ring) = shortest_cycle(start, &edges) {
            on_cycle.extend(ring.iter().map(|(lease, _, _)| *lease));
            cycles.push(rotate_to_lowest(ring));
        }
    }
    Found { stuck, cycles }
}

/// The shortest ring of `edges` through `start` (breadth first), as steps.
fn shortest_cycle(
    start: i64,
    edges: &HashMap<i64, Vec<(usize, i64)>>,
) -> Option<Vec<(i64, usize, i64)>> {
    // How each lease was first reached: from which lease, through which line.
    let mut came_from: HashMap<i64, (i64, usize)> = HashMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(lease) = queue.pop_front() {
        for &(line, next) in edges.get(&lease).into_iter().flatten() {
            if next == start {
                let mut ring = vec![(lease, line, start)];
                let mut at = lease;
                while at != start {
                    let (from, through) = came_from[&at];
                    ring.push((from, through, at));
                    at = from;
                }
                ring.reverse();
                return Some(ring);
            }
            if let std::collections::hash_map::Entry::Vacant(e) = came_from.entry(next) {
                e.insert((lease, line));
                queue.push_back(next);
            }
        }
    }
    None
}

/// `ring` starting at its lowest lease.
fn rotate_to_lowest(mut ring: Vec<(i64, usize, i64)>) -> Vec<(i64, usize, i64)> {
    if let Some(at) = (0..ring.len()).min_by_key(|&i| ring[i].0) {
        ring.rotate_left(at);
    }
    ring
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line of `name` with keys `(lease, suffix)`, oldest first.
    fn line(name: &str, keys: &[(i64, &str)]) -> Line {
        let prefix = format!("{name}/").into_bytes();
        let keys = keys
            .iter()
            .map(|&(lease, suffix)| {
                let key = if lease == 0 {
                    format!("{name}/{suffix}")
                } else {
                    format!("{name}/{lease:x}{suffix}")
                };
                (key.into_bytes(), lease)
            })
            .collect();
        Line { prefix, keys }
    }

    #[test]
    fn two_sessions_each_holding_what_the_other_waits_for() {
        let found = search(vec![
            line("x", &[(0xa, ""), (0xb, "")]),
            line("y", &[(0xb, ""), (0xa, "")]),
        ]);
        assert_eq!(found.stuck, BTreeSet::from([0xa, 0xb]));
        assert_eq!(found.cycles, vec![vec![(0xa, 1, 0xb), (0xb, 0, 0xa)]]);
    }

    #[test]
    fn a_plain_line_is_no_cycle() {
        let found = search(vec![
            line("x", &[(1, ""), (2, ""), (3, "")]),
            line("y", &[(2, ""), (3, "")]),
        ]);
        assert_eq!(found, Found::default());
    }

    #[test]
    fn waiting_behind_a_cycle_is_stuck_but_not_on_it() {
        let found = search(vec![
            line("x", &[(1, ""), (2, ""), (3, "")]),
            line("y", &[(2, ""), (1, "")]),
        ]);
        assert_eq!(found.stuck, BTreeSet::from([1, 2, 3]));
        assert_eq!(found.cycles, vec![vec![(1, 1, 2), (2, 0, 1)]]);
    }

    #[test]
    fn a_cycle_through_a_waiter_ahead_is_found_once_the_holder_goes() {
        // 1 holds x and waits for y behind 3 (who holds y) and 2; 2 waits for x too.
        let found = search(vec![
            line("x", &[(1, ""), (2, "")]),
            line("y", &[(3, ""), (2, ""), (1, "")]),
        ]);
        assert_eq!(found.stuck, BTreeSet::from([1, 2]));
        assert_eq!(found.cycles, vec![vec![(1, 1, 2), (2, 0, 1)]]);
    }

    #[test]
    fn a_semaphore_with_a_free_holder_is_no_deadlock() {
        // 1 and 2 hold s (2 permits); 3 holds x and waits for s; 1 waits for x. 2 will
        // let go, 3 gets its permit, then 1 gets x.
        let found = search(vec![
            line(
                "s",
                &[(1, ".permits-2"), (2, ".permits-2"), (3, ".permits-2")],
            ),
            line("x", &[(3, ""), (1, "")]),
        ]);
        assert_eq!(found, Found::default());
        // If 2 waits for x too, nobody can go on.
        let found = search(vec![
            line(
                "s",
                &[(1, ".permits-2"), (2, ".permits-2"), (3, ".permits-2")],
            ),
            line("x", &[(3, ""), (1, ""), (2, "")]),
        ]);
        assert_eq!(found.stuck, BTreeSet::from([1, 2, 3]));
        // 2 is on no cycle through 1: its own is reported too.
        assert_eq!(
            found.cycles,
            vec![vec![(1, 1, 3), (3, 0, 1)], vec![(2, 1, 3), (3, 0, 2)]]
        );
    }

    #[test]
    fn readers_share_and_a_reader_behind_its_own_writer_waits_for_itself() {
        let found = search(vec![line("r", &[(1, ".shared"), (2, ".shared")])]);
        assert_eq!(found, Found::default());
        let found = search(vec![line("r", &[(1, ""), (1, ".shared")])]);
        assert_eq!(found.cycles, vec![vec![(1, 0, 1)]]);
    }

    #[test]
    fn keys_without_a_lease_never_go_and_wait_for_nothing() {
        let found = search(vec![line("x", &[(0, "data"), (1, "")])]);
        assert_eq!(found.stuck, BTreeSet::from([1]));
        assert!(found.cycles.is_empty());
        let found = search(vec![line("x", &[(1, ""), (0, "data")])]);
        assert_eq!(found, Found::default());
    }

    #[test]
    fn three_in_a_ring_start_at_the_lowest() {
        let found = search(vec![
            line("x", &[(3, ""), (1, "")]),
            line("y", &[(1, ""), (2, "")]),
            line("z", &[(2, ""), (3, "")]),
        ]);
        assert_eq!(found.cycles, vec![vec![(1, 0, 3), (3, 2, 2), (2, 1, 1)]]);
    }
}
