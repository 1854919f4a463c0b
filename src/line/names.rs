//! The lines of the names under a prefix, from one read of it: each name's keys, oldest
//! first, without the twins of downgradable writes, and how many of them hold (the rule
//! every waiter applies, [`mode::holding`]). What `status()`, the wait graph and the
//! deadlock check (`ownership/deadlock.rs`) make of their reads.

use std::collections::{BTreeSet, HashMap};

use crate::line::mode::{self, Mode};
use crate::line::request;
use crate::support::kv::{KeyValue, Range, prefix_end};

/// The read of every key under `prefix`, oldest create revision first; `""` reads the
/// whole keyspace (an empty key is no key to etcd: it starts at `"\0"`).
pub(crate) fn read_of(prefix: &[u8]) -> Range {
    let range = if prefix.is_empty() {
        Range {
            key: vec![0],
            range_end: vec![0],
            ..Range::default()
        }
    } else {
        Range::prefix(prefix)
    };
    Range {
        by_create_revision: Some(true),
        ..range
    }
}

/// Each name's line in `kvs` (every key under `prefix`, oldest first): its prefix
/// `<name>/`, its keys (oldest first, twins left out) and how many hold, by name.
pub(crate) fn lines(prefix: &[u8], kvs: Vec<KeyValue>) -> Vec<(Vec<u8>, Vec<KeyValue>, usize)> {
    let names: BTreeSet<&[u8]> = kvs
        .iter()
        .filter_map(|kv| {
            let slash = kv.key.iter().rposition(|&b| b == b'/')?;
            let name_prefix = &kv.key[..=slash];
            // `/` is the empty name's prefix: no recipe of ours takes it, but Go's
            // `concurrency` does, and a wait-for cycle may pass through it.
            (name_prefix.starts_with(prefix)
                && !request::is_requests_prefix(name_prefix)
                && Mode::of_key(name_prefix, &kv.key).is_some())
            .then_some(name_prefix)
        })
        .collect();
    // The keys in key order, to find each name's keys by two binary searches.
    let mut by_key: Vec<usize> = (0..kvs.len()).collect();
    by_key.sort_by(|&a, &b| kvs[a].key.cmp(&kvs[b].key));
    names
        .into_iter()
        .map(|name_prefix| {
            let end = prefix_end(name_prefix);
            let from = by_key.partition_point(|&i| kvs[i].key.as_slice() < name_prefix);
            let to = by_key.partition_point(|&i| kvs[i].key < end);
            let mut mine: Vec<usize> = by_key[from..to].to_vec();
            mine.sort_unstable(); // back to create order
            let line = mine.into_iter().map(|i| kvs[i].clone()).collect();
            let (line, holding) = split(name_prefix, line);
            (name_prefix.to_vec(), line, holding)
        })
        .collect()
}

/// The line of every key under `prefix`, oldest create revision first (`kvs`, in that
/// order), without the twins of downgradable writes, and how many of its keys hold: what
/// `status()` makes of one read, and the wait graph of each name in a wider one.
pub(crate) fn split(prefix: &[u8], kvs: Vec<KeyValue>) -> (Vec<KeyValue>, usize) {
    let kvs = without_twins(prefix, kvs);
    let keys: Vec<Vec<u8>> = kvs.iter().map(|kv| kv.key.clone()).collect();
    let holding = mode::holding(prefix, &keys);
    (kvs, holding)
}

/// `kvs` without the shared twin of a downgradable write (`<hex>.shared` created at the
/// same revision as the writer key `<hex>` beside it): it is part of that writer's hold,
/// not a reader. Everyone who waits for the twin waits for the writer key too, which has
/// its place, so the line's holders and waiters are the same without it; and etcd sorts
/// the two in no fixed order, which would otherwise show the twin as a reader ahead of
/// its own writer.
fn without_twins(prefix: &[u8], kvs: Vec<KeyValue>) -> Vec<KeyValue> {
    let shared = mode::Mode::Shared.suffix();
    let created: HashMap<Vec<u8>, i64> = kvs
        .iter()
        .map(|kv| (kv.key.clone(), kv.create_revision))
        .collect();
    kvs.into_iter()
        .filter(|kv| {
            let twin_of = kv
                .key
                .strip_suffix(shared.as_slice())
                .filter(|_| mode::Mode::of_key(prefix, &kv.key) == Some(mode::Mode::Shared));
            twin_of.is_none_or(|writer| created.get(writer) != Some(&kv.create_revision))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, rev: i64) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            create_revision: rev,
            mod_revision: rev,
            ..KeyValue::default()
        }
    }

    #[test]
    fn a_name_whose_end_is_another_names_key_keeps_its_own_keys() {
        // The line of `p/a/` ends before `p/a0`, which is a key (lease 0xa0) of `p/`. The
        // line of `p/` holds every key under it, the nested name's too (as Go's does).
        let lines = lines(b"p/", vec![kv("p/a0", 3), kv("p/a/1", 5), kv("p/a/2", 6)]);
        let named = |name: &str| {
            lines
                .iter()
                .find(|(n, ..)| n == name.as_bytes())
                .map(|(_, line, holding)| {
                    let keys: Vec<String> = line.iter().map(|kv| kv.key_str().into()).collect();
                    (keys, *holding)
                })
        };
        let all = ["p/a0", "p/a/1", "p/a/2"].map(String::from).to_vec();
        assert_eq!(named("p/"), Some((all, 1)));
        assert_eq!(
            named("p/a/"),
            Some((vec!["p/a/1".to_string(), "p/a/2".to_string()], 1))
        );
        assert_eq!(lines.len(), 2);
    }

    fn named(
        lines: &[(Vec<u8>, Vec<KeyValue>, usize)],
        name: &str,
    ) -> Option<(Vec<String>, usize)> {
        lines
            .iter()
            .find(|(n, ..)| n == name.as_bytes())
            .map(|(_, line, holding)| {
                (
                    line.iter().map(|kv| kv.key_str().into()).collect(),
                    *holding,
                )
            })
    }

    #[test]
    fn a_key_that_is_the_names_prefix_itself_is_in_its_line_and_blocks() {
        // etcd's range of `p/a/` holds the key `p/a/` too, and every waiter there (ours and
        // Go's) waits for it: the line that status() and the wait graph show must have it.
        let lines = lines(b"p/", vec![kv("p/a/", 2), kv("p/a/1", 5)]);
        let keys = ["p/a/", "p/a/1"].map(String::from).to_vec();
        assert_eq!(named(&lines, "p/a/"), Some((keys, 1)));
    }

    #[test]
    fn a_downgradable_writers_twin_is_left_out_and_every_other_reader_kept() {
        // `p/a.shared` was put by the Txn that put `p/a` (same revision): part of its hold.
        // `p/b.shared` is a reader; `p/d.shared`, put after `p/d`, is a reader too.
        let kvs = vec![
            kv("p/a", 5),
            kv("p/a.shared", 5),
            kv("p/b.shared", 6),
            kv("p/d", 8),
            kv("p/d.shared", 9),
        ];
        let (line, holding) = split(b"p/", kvs);
        let keys: Vec<String> = line.iter().map(|kv| kv.key_str().into()).collect();
        assert_eq!(keys, ["p/a", "p/b.shared", "p/d", "p/d.shared"]);
        assert_eq!(holding, 1);
    }

    #[test]
    fn the_empty_name_of_a_go_lock_is_a_line_of_the_whole_keyspace() {
        // Go's `concurrency.NewMutex(s, "")` queues under `/`; a wait-for cycle may pass
        // through it, so the graph of the whole keyspace has its line.
        let lines = lines(b"", vec![kv("/a0", 2), kv("/a1", 3), kv("x/b", 4)]);
        let keys = ["/a0", "/a1"].map(String::from).to_vec();
        assert_eq!(named(&lines, "/"), Some((keys, 1)));
        assert_eq!(named(&lines, "x/"), Some((vec!["x/b".to_string()], 1)));
        assert_eq!(lines.len(), 2);
    }

    #[test]
    fn the_release_requests_beside_a_name_are_no_line_of_their_own() {
        // `p/a.revoke/694d` asks the holder of `p/a` to let go (`line/request.rs`): it
        // mirrors a holder's key and lease, and neither status() nor the wait graph may
        // show it as a name held by that lease.
        let lines = lines(b"p/", vec![kv("p/a/694d", 2), kv("p/a.revoke/694d", 3)]);
        assert_eq!(
            named(&lines, "p/a/"),
            Some((vec!["p/a/694d".to_string()], 1))
        );
        assert_eq!(named(&lines, "p/a.revoke/"), None);
        assert_eq!(
            lines.len(),
            1,
            "{:?}",
            lines.iter().map(|l| &l.0).collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_read_of_a_prefix_covers_it_oldest_first_and_an_empty_one_the_keyspace() {
        let read = read_of(b"p/");
        assert_eq!(read.key, b"p/".to_vec());
        assert_eq!(read.range_end, b"p0".to_vec());
        assert_eq!(read.by_create_revision, Some(true));
        let everything = read_of(b"");
        assert_eq!((everything.key, everything.range_end), (vec![0], vec![0]));
        assert_eq!(everything.by_create_revision, Some(true));
    }
}
