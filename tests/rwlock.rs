//! The read-write lock against real etcd: readers share, writers exclude everyone, the line
//! is fair, and the write side is the line of `Mutex` and `etcdctl lock`.

#![cfg(feature = "testing")]

mod common;

use std::time::{Duration, Instant};

use common::{
    ChildGuard, client, etcd, etcdctl_command as etcdctl, eventually, keys, session, store_ranges,
};
use etcd_sync::{Error, TryLockError};

#[test]
fn readers_overlap_and_a_writer_excludes_them() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (s1, s2, s3) = (session(&c, 10), session(&c, 10), session(&c, 10));
    let r1 = s1.rwlock("rw").unwrap().read().unwrap();
    let r2 = s2
        .rwlock("rw")
        .unwrap()
        .try_read()
        .expect("a second reader holds beside the first");
    assert!(r1.is_held() && r2.is_held());
    assert!(r1.key_str().ends_with(".shared"), "{}", r1.key_str());
    let w = s3.rwlock("rw").unwrap();
    assert!(matches!(w.try_write(), Err(TryLockError::WouldBlock)));
    assert_eq!(keys(&c, "rw/").len(), 2, "a failed try_write leaves no key");
    let timed = w.write_timeout(Duration::from_millis(300));
    assert!(
        timed.as_ref().is_err_and(Error::is_wait_timeout),
        "{timed:?}"
    );
    assert_eq!(keys(&c, "rw/").len(), 2, "a timed-out write leaves no key");
    let writer = std::thread::spawn(move || w.write().map(|g| (Instant::now(), g)));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!writer.is_finished(), "the writer held beside readers");
    drop(r1);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !writer.is_finished(),
        "the writer held beside the second reader"
    );
    let released = Instant::now();
    drop(r2);
    let (held_at, g) = writer.join().unwrap().unwrap();
    assert!(held_at >= released);
    assert!(!g.key_str().contains('.'), "a writer's key is a Mutex key");
    // While the writer holds, no reader does.
    assert!(matches!(
        s1.rwlock("rw").unwrap().try_read(),
        Err(TryLockError::WouldBlock)
    ));
    g.release().unwrap();
    assert!(keys(&c, "rw/").is_empty());
}

/// A writer waiting behind readers is not overtaken by readers that come after it.
#[test]
fn a_waiting_writer_is_not_overtaken_by_later_readers() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (s1, s2, s3) = (session(&c, 10), session(&c, 10), session(&c, 10));
    let r1 = s1.rwlock("fair").unwrap().read().unwrap();
    let w = s2.rwlock("fair").unwrap();
    let writer = std::thread::spawn(move || w.write().map(|g| (g.fencing_token(), g)));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "fair/")
        .len()
        == 2));
    let late = s3.rwlock("fair").unwrap();
    assert!(
        matches!(late.try_read(), Err(TryLockError::WouldBlock)),
        "a later reader passed a waiting writer"
    );
    let reader = std::thread::spawn(move || late.read().map(|g| (g.fencing_token(), g)));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!reader.is_finished() && !writer.is_finished());
    drop(r1);
    let (w_token, wg) = writer.join().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !reader.is_finished(),
        "the late reader held beside the writer"
    );
    drop(wg);
    let (r_token, _rg) = reader.join().unwrap().unwrap();
    assert!(r_token > w_token, "the reader queued after the writer");
}

/// The write side is the line of `Mutex` and `etcdctl lock`: each excludes the others and
/// every reader, in both directions.
#[test]
fn mutex_and_etcdctl_lock_exclude_readers_and_writers() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (s1, s2) = (session(&c, 10), session(&c, 10));
    // Our reader holds: a Mutex and etcdctl lock wait for it.
    let r = s1.rwlock("mix").unwrap().read().unwrap();
    assert!(matches!(
        s2.mutex("mix").unwrap().try_lock(),
        Err(TryLockError::WouldBlock)
    ));
    let mut child = ChildGuard::spawn(etcdctl(
        &server.endpoint(),
        &["lock", "mix", "--", "echo", "got-it"],
    ));
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        child.child().try_wait().unwrap().is_none(),
        "etcdctl took the lock while a reader held it"
    );
    drop(r);
    let out = child.take().wait_with_output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("got-it"));
    // A Mutex holds: neither a reader nor a writer does.
    let m = s2.mutex("mix").unwrap().lock().unwrap();
    let rw = s1.rwlock("mix").unwrap();
    assert!(matches!(rw.try_read(), Err(TryLockError::WouldBlock)));
    assert!(matches!(rw.try_write(), Err(TryLockError::WouldBlock)));
    drop(m);
    // etcdctl holds: a reader waits until it is done.
    let mut child = ChildGuard::spawn(etcdctl(
        &server.endpoint(),
        &["lock", "mix", "--", "sleep", "1"],
    ));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "mix/")
        .len()
        == 1));
    let started = Instant::now();
    let read = rw.read().unwrap();
    assert!(
        started.elapsed() > Duration::from_millis(400),
        "read beside etcdctl's lock"
    );
    assert!(child.child().wait().unwrap().success());
    drop(read);
    assert!(keys(&c, "mix/").is_empty());
}

#[test]
fn one_thread_cannot_wait_on_its_own_read_lock() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let rw = s.rwlock("self").unwrap();
    let r = rw.read().unwrap();
    assert!(matches!(rw.write(), Err(Error::WouldDeadlock(_))));
    assert!(matches!(
        s.mutex("self").unwrap().lock(),
        Err(Error::WouldDeadlock(_))
    ));
    assert!(matches!(rw.try_write(), Err(TryLockError::WouldBlock)));
    drop(r);
    let w = rw.write().unwrap();
    assert!(matches!(rw.read(), Err(Error::WouldDeadlock(_))));
    drop(w);
    assert!(keys(&c, "self/").is_empty());
}

/// Guards of the read-write lock follow their key and fence their writes, as `Mutex`'s do.
#[test]
fn a_deleted_read_key_ends_the_guard_and_its_writes() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let r = s.rwlock("del").unwrap().read().unwrap();
    let revision = r.put("del-data", "1").unwrap();
    assert!(revision > 0);
    let lost = r.lost();
    c.delete(r.key()).unwrap();
    assert!(lost.recv_timeout(Duration::from_secs(2)).is_err());
    assert!(!r.is_held());
    assert!(matches!(r.put("del-data", "2"), Err(Error::LockLost)));
    assert!(matches!(r.release(), Err(Error::LockLost)));
    assert_eq!(c.get("del-data").unwrap().unwrap().value, b"1");
}

// ---- Downgrade: a write lock becomes a read lock with no gap (the shared twin key). ----

/// Our downgradable writer holds; a reader and then a writer queue behind it, and a reader
/// behind that writer. The downgrade lets the first reader in at once, while the queued
/// writer gets in only after every read guard ahead of it is dropped (never between our
/// write and our read), and the last reader waits for that writer (fairness unchanged).
#[test]
fn a_downgrade_lets_queued_readers_in_and_keeps_queued_writers_out() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (s1, s2, s3, s4) = (
        session(&c, 10),
        session(&c, 10),
        session(&c, 10),
        session(&c, 10),
    );
    let write = s1.rwlock("dg").unwrap().write_downgradable().unwrap();
    assert!(write.is_downgradable());
    let token = write.fencing_token();
    assert_eq!(keys(&c, "dg/").len(), 2, "the writer key and its twin");
    let early = s2.rwlock("dg").unwrap();
    let early_reader = std::thread::spawn(move || early.read().map(|g| (Instant::now(), g)));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "dg/").len() == 3));
    let w = s3.rwlock("dg").unwrap();
    let writer = std::thread::spawn(move || w.write().map(|_g| Instant::now()));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "dg/").len() == 4));
    let late = s4.rwlock("dg").unwrap();
    let late_reader = std::thread::spawn(move || late.read().map(|g| (Instant::now(), g)));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "dg/").len() == 5));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!early_reader.is_finished() && !writer.is_finished() && !late_reader.is_finished());
    let downgraded_at = Instant::now();
    let read = write.downgrade().unwrap();
    assert!(read.is_held());
    assert_eq!(
        read.fencing_token(),
        token,
        "the read keeps the write's place"
    );
    assert!(read.key_str().ends_with(".shared"), "{}", read.key_str());
    let (early_at, early_guard) = early_reader.join().unwrap().unwrap();
    assert!(early_at >= downgraded_at);
    assert!(
        early_at.duration_since(downgraded_at) < Duration::from_secs(2),
        "the reader behind us got in right after the downgrade"
    );
    // The early reader leaves: only our read guard (the twin) keeps the writer out now.
    drop(early_guard);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !writer.is_finished(),
        "a queued writer got in between our write and our read"
    );
    assert!(
        read.is_held(),
        "deleting our writer key did not end the read guard"
    );
    assert!(
        !late_reader.is_finished(),
        "a reader passed a waiting writer"
    );
    let ours_dropped_at = Instant::now();
    drop(read);
    let writer_at = writer.join().unwrap().unwrap();
    assert!(
        writer_at >= ours_dropped_at,
        "the writer held beside our read"
    );
    let (late_at, late_guard) = late_reader.join().unwrap().unwrap();
    assert!(late_at >= writer_at);
    drop(late_guard);
    assert!(eventually(Duration::from_secs(5), || keys(&c, "dg/").is_empty()));
}

/// Every way a downgradable write or its read guard ends removes both keys.
#[test]
fn a_downgradable_write_leaves_no_key_behind() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (s1, s2) = (session(&c, 10), session(&c, 10));
    let rw = s1.rwlock("left").unwrap();
    // Released, dropped.
    rw.write_downgradable().unwrap().release().unwrap();
    assert!(keys(&c, "left/").is_empty(), "after release");
    drop(rw.write_downgradable().unwrap());
    assert!(keys(&c, "left/").is_empty(), "after Drop");
    // Downgraded, then released or dropped.
    rw.write_downgradable()
        .unwrap()
        .downgrade()
        .unwrap()
        .release()
        .unwrap();
    assert!(keys(&c, "left/").is_empty(), "after the read's release");
    drop(rw.write_downgradable().unwrap().downgrade().unwrap());
    assert!(keys(&c, "left/").is_empty(), "after the read's Drop");
    // A wait that fails (try_, timeout) removes both keys.
    let other = s2.rwlock("left").unwrap().write().unwrap();
    assert!(matches!(
        rw.try_write_downgradable(),
        Err(TryLockError::WouldBlock)
    ));
    assert_eq!(keys(&c, "left/").len(), 1, "a failed try_ leaves no key");
    let timed = rw.write_downgradable_timeout(Duration::from_millis(300));
    assert!(
        timed.as_ref().is_err_and(Error::is_wait_timeout),
        "{timed:?}"
    );
    assert_eq!(keys(&c, "left/").len(), 1, "a timed-out wait leaves no key");
    drop(other);
    // Session closed while writing, and while reading after a downgrade.
    let s3 = session(&c, 10);
    let write = s3.rwlock("left").unwrap().write_downgradable().unwrap();
    s3.close().unwrap();
    assert!(keys(&c, "left/").is_empty(), "after the session closed");
    assert!(!write.is_held());
    let s4 = session(&c, 10);
    let read = s4
        .rwlock("left")
        .unwrap()
        .write_downgradable()
        .unwrap()
        .downgrade()
        .unwrap();
    s4.close().unwrap();
    assert!(keys(&c, "left/").is_empty());
    assert!(!read.is_held());
}

/// `status()` shows one writer while we write (the twin is part of its hold), then one
/// reader with the same fencing token.
#[test]
fn status_shows_one_writer_then_one_reader() {
    use etcd_sync::KeyMode;
    let server = etcd();
    let c = client(&server.endpoints());
    let (s1, s2) = (session(&c, 10), session(&c, 10));
    let rw = s1.rwlock("st").unwrap();
    let write = rw.write_downgradable().unwrap();
    let w = s2.rwlock("st").unwrap();
    let writer = std::thread::spawn(move || w.write().map(|_| ()));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "st/").len() == 3));
    let status = rw.status().unwrap();
    assert_eq!(status.holders.len(), 1, "{status:?}");
    assert_eq!(status.holders[0].mode, KeyMode::Exclusive);
    assert_eq!(status.holders[0].key_str(), write.key_str());
    assert_eq!(status.waiters.len(), 1, "{status:?}");
    let token = write.fencing_token();
    let read = write.downgrade().unwrap();
    let status = rw.status().unwrap();
    assert_eq!(status.holders.len(), 1, "{status:?}");
    assert_eq!(status.holders[0].mode, KeyMode::Shared);
    assert_eq!(status.holders[0].create_revision, token);
    assert_eq!(status.waiters.len(), 1, "{status:?}");
    drop(read);
    writer.join().unwrap().unwrap();
}

/// `etcdctl lock` (Go's `Mutex`) of the same name waits for every older key: for our
/// writer key while we write, and for the twin after the downgrade, until the read guard
/// is dropped.
#[test]
fn etcdctl_lock_waits_for_a_downgradable_write_and_its_read() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let write = s.rwlock("go").unwrap().write_downgradable().unwrap();
    let mut child = ChildGuard::spawn(etcdctl(
        &server.endpoint(),
        &["lock", "go", "--", "echo", "got-it"],
    ));
    assert!(eventually(Duration::from_secs(5), || keys(&c, "go/").len() == 3));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.child().try_wait().unwrap().is_none(),
        "etcdctl took the lock while we wrote"
    );
    let read = write.downgrade().unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        child.child().try_wait().unwrap().is_none(),
        "etcdctl took the lock while we read after the downgrade"
    );
    drop(read);
    let out = child.take().wait_with_output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("got-it"));
}

/// A write guard follows both of its keys; a read guard after a downgrade follows the twin.
#[test]
fn a_deleted_twin_or_writer_key_is_a_loss() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let rw = s.rwlock("gone").unwrap();
    // The twin deleted: the write guard is lost, and cannot downgrade.
    let write = rw.write_downgradable().unwrap();
    let lost = write.lost();
    c.delete(format!("{}.shared", write.key_str())).unwrap();
    assert!(lost.recv_timeout(Duration::from_secs(2)).is_err());
    assert!(!write.is_held());
    let e = write.downgrade().unwrap_err();
    assert!(matches!(e.error(), Error::LockLost), "{e:?}");
    assert!(e.into_guard().is_none());
    assert!(keys(&c, "gone/").is_empty(), "the writer key was released");
    // The writer key deleted: lost too.
    let write = rw.write_downgradable().unwrap();
    let lost = write.lost();
    c.delete(write.key()).unwrap();
    assert!(lost.recv_timeout(Duration::from_secs(2)).is_err());
    assert!(
        matches!(write.downgrade().map(|_| ()), Err(e) if matches!(e.error(), Error::LockLost))
    );
    assert!(keys(&c, "gone/").is_empty(), "the twin was released");
    // After a downgrade, the twin deleted: the read guard is lost.
    let read = rw.write_downgradable().unwrap().downgrade().unwrap();
    let lost = read.lost();
    assert!(
        lost.recv_timeout(Duration::from_millis(500))
            .is_err_and(|e| e.is_timeout()),
        "the downgrade's own delete of the writer key ended the read guard"
    );
    c.delete(read.key()).unwrap();
    assert!(
        lost.recv_timeout(Duration::from_secs(2))
            .is_err_and(|e| e.is_disconnected())
    );
    assert!(!read.is_held());
    assert!(matches!(read.release(), Err(Error::LockLost)));
}

/// A write guard from `write()` is not downgradable: a clear error, and the guard back.
#[test]
fn a_plain_write_cannot_downgrade_and_is_handed_back() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let write = s.rwlock("plain").unwrap().write().unwrap();
    assert!(!write.is_downgradable());
    assert_eq!(keys(&c, "plain/").len(), 1, "a plain write is one key");
    let e = write.downgrade().unwrap_err();
    assert!(matches!(e.error(), Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("write_downgradable"), "{e}");
    let write = e.into_guard().expect("the write guard comes back");
    assert!(write.is_held());
    assert_eq!(keys(&c, "plain/").len(), 1, "nothing was sent");
    write.release().unwrap();
}

/// The twin is this session's reader key: a read of the same session on another thread
/// waits for the downgradable write (it must not replace the twin), and a downgradable
/// write waits for a read guard of its own session.
#[test]
fn the_twin_is_not_taken_by_a_read_of_the_same_session() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let write = s.rwlock("same").unwrap().write_downgradable().unwrap();
    let before = keys(&c, "same/");
    let read = common::read_on_another_thread(&s, "same", Duration::from_millis(800));
    assert!(read.as_ref().is_err_and(Error::is_wait_timeout), "{read:?}");
    assert!(write.is_held());
    assert_eq!(keys(&c, "same/"), before, "the twin was left alone");
    let read = write.downgrade().unwrap();
    let other = s.clone();
    let write = std::thread::spawn(move || {
        other
            .rwlock("same")
            .unwrap()
            .write_downgradable_timeout(Duration::from_millis(800))
            .map(|_| ())
    })
    .join()
    .unwrap();
    assert!(
        write.as_ref().is_err_and(Error::is_wait_timeout),
        "{write:?}"
    );
    assert!(read.is_held());
    assert_eq!(keys(&c, "same/"), vec![read.key_str().into_owned()]);
}

/// The enqueue of a downgradable write times out on a frozen member and may be applied
/// when it resumes: a late copy puts both keys at once, and each line's sweep deletes its
/// own. Nothing is left, whether the write was then taken through another member or the
/// attempt timed out.
#[test]
fn a_late_applied_downgradable_enqueue_leaves_no_key_behind() {
    let cl = common::cluster();
    let all = cl.endpoints();
    let leader = cl.leader().unwrap();
    let follower = (leader + 1) % all.len();
    let ordered: Vec<String> = (0..all.len())
        .map(|i| all[(follower + i) % all.len()].clone())
        .collect();
    let c = common::client_with_timeout(&ordered, Duration::from_millis(500));
    let s = session(&c, 20);
    let rw = s.rwlock("late").unwrap();
    cl.pause(follower).unwrap();
    let write = rw.write_downgradable().expect("through another member");
    let token = write.fencing_token();
    write.downgrade().unwrap().release().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    cl.resume(follower).unwrap();
    let observer = etcd_sync::Client::connect(&all[leader..=leader]).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || keys(&observer, "late/")
            .is_empty()),
        "our keys are left behind: {:?}",
        keys(&observer, "late/")
    );
    let other = session(&observer, 20);
    let next = other
        .rwlock("late")
        .unwrap()
        .write_timeout(Duration::from_secs(3))
        .expect("the next writer does not wait for our session");
    assert!(next.fencing_token() > token);
    drop(next);
    // A timed-out attempt on the frozen member: cut short, cleaned up by lease (both
    // keys, each line's turn in hand) and swept.
    let c2 = common::client_with_timeout(&ordered, Duration::from_millis(500));
    let s2 = session(&c2, 20);
    let timed = s2.rwlock("late").unwrap();
    cl.pause(follower).unwrap();
    let e = timed
        .write_downgradable_timeout(Duration::from_millis(200))
        .unwrap_err();
    assert!(e.is_wait_timeout() || e.is_retryable(), "{e:?}");
    cl.resume(follower).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || keys(&observer, "late/")
            .is_empty()),
        "a timed-out attempt left keys: {:?}",
        keys(&observer, "late/")
    );
    assert!(s.is_alive() && s2.is_alive());
    let _held = other
        .rwlock("late")
        .unwrap()
        .write_timeout(Duration::from_secs(3))
        .expect("free again");
}

/// Issue 48, item 2: another client deletes our writer key (a forced release) right before
/// `downgrade()`. The downgrade must not take the twin for an earlier copy of its own Txn:
/// it fails with `LockLost`, hands back no read guard, the write guard's `lost()` fires, and
/// the twin is released, so a queued writer of another session gets in.
#[test]
fn a_downgrade_after_a_forced_release_of_the_writer_key_is_a_loss() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 20);
    let rw = s.rwlock("forced").unwrap();
    for (round, delay_ms) in [0u64, 0, 10, 30, 60, 100].into_iter().enumerate() {
        let write = rw.write_downgradable().unwrap();
        let lost = write.lost();
        c.delete(write.key()).unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let outcome = write.downgrade();
        let held = outcome.as_ref().map(|read| read.is_held());
        assert!(
            matches!(&outcome, Err(e) if matches!(e.error(), Error::LockLost)),
            "round {round} ({delay_ms} ms): downgrade after a forced release gave {held:?}"
        );
        assert!(
            lost.recv_timeout(Duration::from_secs(2))
                .is_err_and(|e| e.is_disconnected()),
            "round {round}: the write guard never reported the loss"
        );
        drop(outcome);
        assert!(
            eventually(Duration::from_secs(3), || keys(&c, "forced/").is_empty()),
            "round {round}: the twin was kept: {:?}",
            keys(&c, "forced/")
        );
    }
    // The name is free for a writer of another session.
    let other = session(&c, 20);
    let next = other
        .rwlock("forced")
        .unwrap()
        .write_timeout(Duration::from_secs(3));
    assert!(next.is_ok(), "{:?}", next.map(|_| ()));
}

/// A reader behind more keys than the enqueue Txn returns (1,024) reads its place in pages
/// and waits its turn, alone or in a multi-lock, when those it was given are all readers
/// (which it passes) and a writer waits beyond them; it takes the lock once that is gone.
#[test]
fn a_reader_behind_more_than_a_thousand_readers_and_a_writer_waits_its_turn() {
    let server = etcd();
    let c = client(&server.endpoints());
    // The oldest key is no reader's (it blocks readers as a writer's would), then 1,100
    // readers' keys (`<lease hex>.shared`, leases that do not exist: plain puts).
    c.put("long/a-writer", "").unwrap();
    const READERS: u64 = 1_100;
    common::put_plain(&c, (1..=READERS).map(|i| format!("long/{i:x}.shared")));
    let s = session(&c, 10);
    let rw = s.rwlock("long").unwrap();
    assert!(matches!(rw.try_read(), Err(TryLockError::WouldBlock)));
    let e = rw.read_timeout(Duration::from_millis(300)).unwrap_err();
    assert!(e.is_wait_timeout(), "{e:?}");
    let multi = etcd_sync::MultiLock::new([
        etcd_sync::MultiLockMember::read(&rw),
        etcd_sync::MultiLockMember::from(&s.mutex("long-other").unwrap()),
    ])
    .unwrap();
    assert!(matches!(multi.try_lock(), Err(TryLockError::WouldBlock)));
    let e = multi.lock_timeout(Duration::from_millis(300)).unwrap_err();
    assert!(e.is_wait_timeout(), "{e:?}");
    assert_eq!(
        keys(&c, "long/").len(),
        READERS as usize + 1,
        "nothing of ours is left"
    );
    c.delete("long/a-writer").unwrap();
    rw.read_timeout(Duration::from_secs(5))
        .unwrap()
        .release()
        .unwrap();
    multi
        .lock_timeout(Duration::from_secs(5))
        .unwrap()
        .release()
        .unwrap();
}

/// A reader behind exactly two full pages of readers (2 × 1,024, each put alone) and a
/// writer beyond them: a full page does not end the line, so it reads another and waits.
#[test]
fn a_reader_behind_two_full_pages_of_readers_and_a_writer_waits_its_turn() {
    let server = etcd();
    let c = client(&server.endpoints());
    // Last in key order (after every hex lease id): the unsorted read in the enqueue Txn
    // does not reach it, the position read must.
    c.put("pages/writer", "").unwrap();
    for i in 1..=2 * 1_024u64 {
        c.put(format!("pages/{i:x}.shared"), "").unwrap();
    }
    let s = session(&c, 10);
    let rw = s.rwlock("pages").unwrap();
    assert!(matches!(rw.try_read(), Err(TryLockError::WouldBlock)));
    let e = rw.read_timeout(Duration::from_millis(300)).unwrap_err();
    assert!(e.is_wait_timeout(), "{e:?}");
    c.delete("pages/writer").unwrap();
    rw.read_timeout(Duration::from_secs(5))
        .unwrap()
        .release()
        .unwrap();
}

/// A writer's key put in one Txn with 99 readers' keys, then 1,023 readers each alone: the
/// first page of a reader's place read (1,024 keys) ends among that Txn's keys, and the
/// next page must read the rest of them, the writer's among them, not only older ones.
/// Before, it skipped them, and the reader took its turn beside the writer.
#[test]
fn a_reader_sees_a_writer_put_in_one_txn_with_readers_across_a_page_boundary() {
    let server = etcd();
    let c = client(&server.endpoints());
    let one_txn = std::iter::once(etcd_sync::TxnOp::put("split/writer", ""))
        .chain((1..=99u64).map(|i| etcd_sync::TxnOp::put(format!("split/{i:x}.shared"), "")));
    c.txn(etcd_sync::Txn::new().and_then(one_txn)).unwrap();
    for i in 100..100 + 1_023u64 {
        c.put(format!("split/{i:x}.shared"), "").unwrap();
    }
    let s = session(&c, 10);
    let rw = s.rwlock("split").unwrap();
    assert!(matches!(rw.try_read(), Err(TryLockError::WouldBlock)));
    c.delete("split/writer").unwrap();
    rw.read_timeout(Duration::from_secs(5))
        .unwrap()
        .release()
        .unwrap();
}

/// A downgradable write's Txn reads the line and nothing else, also on a name's first
/// acquisition: it puts two keys only if both are absent, so a leftover key of our lease
/// fails its compares and is read then, not in every Txn (the store's range count: two
/// compares and the line's read). Its release compares both keys' create revision and our
/// lease. (Mutation testing, `line/queue/mod.rs`: `&&` → `||` in the lease read's
/// condition read our lease's keys in a downgradable write's Txn too.)
#[test]
fn a_downgradable_write_reads_only_the_line_in_its_txn() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 30);
    let rw = s.rwlock("reads-rw").unwrap();
    let ranges = || store_ranges(&server.metrics().unwrap());
    for round in 0..2 {
        let before = ranges();
        let write = rw.write_downgradable().unwrap();
        let acquired = ranges();
        drop(write);
        let released = ranges();
        assert_eq!(
            acquired - before,
            3,
            "round {round}: ranges of the acquisition"
        );
        assert_eq!(
            released - acquired,
            4,
            "round {round}: ranges of the release"
        );
    }
}
