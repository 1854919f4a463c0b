//! Keys of our own lease that nothing in this process uses (leftovers of an earlier life of
//! a resumed lease, `ownership/leftover.rs`): a wait never waits behind one, wherever it is
//! in the line, and never touches a key this process uses.

#![cfg(feature = "testing")]

mod common;

use std::time::{Duration, Instant};

use common::{client, etcd, eventually, keys, session};
use etcd_sync::{Error, TryLockError};

/// A process that resumed its lease after a restart finds a writer key of its previous
/// life under the name (an enqueue etcd applied after the old process gave up on it). Its
/// read does not wait behind that key (nor would anyone else, until the session ends):
/// nothing in this process uses it, so the read removes it and holds at once. Before the
/// fix (found by the simulation, issue 29) the read waited out its whole limit.
#[test]
fn a_resumed_session_removes_its_own_leftover_writer_key() {
    resumed_with_a_leftover_writer_key(false);
}

/// The same, for a line whose last enqueue met a short line: the Txn then reads no keys of
/// our lease apart; the leftover is among the keys ahead, and in the Txn's read of the line
/// (which returned every key under the name).
#[test]
fn a_leftover_is_found_in_the_read_of_a_short_line() {
    resumed_with_a_leftover_writer_key(true);
}

/// A process restarted on its lease: a new client, and a session resuming the lease of a
/// session of another client that was orphaned (its keys stay). With the lease.
fn resumed_session(
    server: &etcd_sync::testing::EtcdServer,
) -> (etcd_sync::Client, etcd_sync::Session, i64) {
    let old = client(&server.endpoints());
    let first = session(&old, 10);
    let lease = first.lease_id();
    first.orphan();
    let c = client(&server.endpoints());
    let resumed = c.session_builder().resume(lease).start().unwrap();
    (c, resumed, lease)
}

fn resumed_with_a_leftover_writer_key(after_a_short_line: bool) {
    let server = etcd();
    let (c, resumed, lease) = resumed_session(&server);
    let rw = resumed.rwlock("leftover").unwrap();
    if after_a_short_line {
        rw.read().unwrap().release().unwrap();
    }
    // The write enqueue of the old life, applied late: our lease's writer key.
    c.put_with_lease(format!("leftover/{lease:x}"), "", lease)
        .unwrap();
    let started = Instant::now();
    let read = rw
        .read_timeout(Duration::from_secs(5))
        .expect("the read holds once our leftover writer key is gone");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        keys(&c, "leftover/"),
        vec![format!("leftover/{lease:x}.shared")],
        "the leftover writer key was removed"
    );
    assert!(read.is_held());
}

/// A downgradable write of a resumed session finds one key of its pair left from the old
/// life (the writer key, or its reader twin, alone): it removes it and takes both afresh,
/// newer than the leftover. (Mutation testing, shard 8/10: `line/queue/existing.rs:42`,
/// a join that took one leftover key of the pair for none and joined again until it gave
/// up, "kept appearing and going".)
#[test]
fn a_downgradable_write_over_one_leftover_key_of_its_pair_takes_both_afresh() {
    for suffix in ["", ".shared"] {
        let server = etcd();
        let (c, resumed, lease) = resumed_session(&server);
        let leftover = format!("pair/{lease:x}{suffix}");
        let left_at = c.put_with_lease(&leftover, "", lease).unwrap();
        let write = resumed
            .rwlock("pair")
            .unwrap()
            .write_downgradable_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{leftover:?} left: {e}"));
        assert!(write.fencing_token() > left_at, "{leftover:?} left");
        assert_eq!(
            keys(&c, "pair/"),
            vec![format!("pair/{lease:x}"), format!("pair/{lease:x}.shared")],
            "{leftover:?} left"
        );
        write.release().unwrap();
        assert!(keys(&c, "pair/").is_empty(), "{leftover:?} left");
    }
}

/// The same rule never touches a key this process uses: a writer of the same session on
/// another thread keeps its key, and the read waits for it like any reader.
#[test]
fn a_read_waits_for_a_live_writer_of_its_own_session() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let writer = s.rwlock("own").unwrap().write().unwrap();
    let read = common::read_on_another_thread(&s, "own", Duration::from_millis(800));
    assert!(read.as_ref().is_err_and(Error::is_wait_timeout), "{read:?}");
    assert!(writer.is_held(), "the writer's key was left alone");
    assert_eq!(keys(&c, "own/"), vec![writer.key_str().into_owned()]);
}

/// The same leftover far ahead: a reader key of our earlier life with a line behind it
/// longer than the front (`line/behind/`, `FRONT`: 16), every waiter in it stuck behind
/// that key. A write joining that line reads only the newest keys ahead, so it never saw
/// the leftover, waited at the back, and everyone waited out their limits (found by the
/// simulation's back-of-line sweep, seed 1795584862204072, in CI). The enqueue now also
/// reads the keys of its own lease under the name: the write removes the leftover, the
/// line drains in order, and the write holds.
#[test]
fn a_leftover_far_ahead_of_a_long_line_is_removed_and_the_line_drains() {
    leftover_far_ahead("far", None);
}

/// The same, for a line whose last enqueue met a short line: that one found our lease's
/// keys in its read of the line, and this one, meeting a long line, reads them after its
/// Txn.
#[test]
fn a_leftover_far_ahead_is_found_also_after_a_short_line() {
    leftover_far_ahead("far-again", Some(0));
}

/// The same, for a line whose last enqueue met a long line too: that one marked the line
/// long, so this one reads our lease's keys in its Txn (a survivor of mutants shard 2/10,
/// `long`'s `>` as `==`, read them only after a short line and left this one behind its
/// own leftover).
#[test]
fn a_leftover_far_ahead_is_found_also_after_a_long_line() {
    leftover_far_ahead("far-long", Some(24));
}

/// `before`: a write of ours taken and released first, behind that many other writers.
fn leftover_far_ahead(name: &str, before: Option<usize>) {
    const LINE: usize = 24;
    let server = etcd();
    let old = client(&server.endpoints());
    let first = session(&old, 10);
    let lease = first.lease_id();
    first.orphan();
    let c = client(&server.endpoints());
    let resumed = c.session_builder().resume(lease).start().unwrap();
    let rw = resumed.rwlock(name).unwrap();
    let prefix = format!("{name}/");
    let others = client(&server.endpoints());
    let line_of = |n: usize| -> Vec<_> {
        (0..n)
            .map(|_| {
                let rw = session(&others, 10).rwlock(name).unwrap();
                std::thread::spawn(move || {
                    rw.write_timeout(Duration::from_secs(20))
                        .map(|g| g.release().map(|_| ()))
                })
            })
            .collect()
    };
    if let Some(ahead) = before {
        let holder = session(&others, 10).mutex(name).unwrap().lock().unwrap();
        let line = line_of(ahead);
        assert!(eventually(Duration::from_secs(10), || keys(
            &others, &prefix
        )
        .len()
            == ahead + 1));
        // Another handle on the same session's place under the name (it shares `rw`'s).
        let first = resumed.rwlock(name).unwrap();
        let write = std::thread::spawn(move || {
            first
                .write_timeout(Duration::from_secs(20))
                .map(|g| g.release().map(|_| ()))
        });
        assert!(eventually(Duration::from_secs(10), || keys(
            &others, &prefix
        )
        .len()
            == ahead + 2));
        holder.release().unwrap();
        for waiter in line {
            waiter.join().unwrap().unwrap().unwrap();
        }
        write.join().unwrap().unwrap().unwrap();
    }
    c.put_with_lease(format!("{prefix}{lease:x}.shared"), "", lease)
        .unwrap();
    let waiters = line_of(LINE);
    assert!(
        eventually(Duration::from_secs(10), || keys(&others, &prefix).len()
            == LINE + 1),
        "{} keys",
        keys(&others, &prefix).len()
    );
    let started = Instant::now();
    let write = rw.write_timeout(Duration::from_secs(10));
    let took = started.elapsed();
    let write = write.expect("the write holds once our leftover is gone and the line drained");
    assert!(took < Duration::from_secs(8), "{took:?}");
    let mut held = 0;
    for waiter in waiters {
        waiter.join().unwrap().unwrap().unwrap();
        held += 1;
    }
    assert_eq!(held, LINE, "every waiter ahead held and released");
    assert_eq!(keys(&c, &prefix), vec![write.key_str().into_owned()]);
    assert!(write.is_held());
}

/// Only keys of our own lease are leftovers: a `try_write` behind another session's reader
/// reads nothing beside its join and its cleanup (etcd's Range count, the cleanup in the
/// background given time to finish). (Mutation testing, shard 6/10: `leftover.rs`, `||` →
/// `&&` in the lease check, read every key of another lease in another mode ahead.)
#[test]
fn keys_of_other_leases_ahead_are_never_read_as_leftovers() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (reader, writer) = (session(&c, 10), session(&c, 10));
    let _read = reader.rwlock("others").unwrap().read().unwrap();
    let rw = writer.rwlock("others").unwrap();
    let ranges = || common::handled(&server.metrics().unwrap(), "Range");
    // The reader's guard follows its key from a read after its first 200 ms.
    std::thread::sleep(Duration::from_millis(500));
    let before = ranges();
    for _ in 0..3 {
        assert!(matches!(rw.try_write(), Err(TryLockError::WouldBlock)));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(ranges() - before, 0, "a key of another lease was read");
    assert_eq!(keys(&c, "others/").len(), 1, "the reader's key alone");
}
