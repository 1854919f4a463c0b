//! The read-write lock against real etcd: readers share, writers exclude everyone, the line
//! is fair, and the write side is the line of `Mutex` and `etcdctl lock`.

#![cfg(feature = "testing")]

mod common;

use std::time::{Duration, Instant};

use common::{ChildGuard, client, etcd, etcdctl_command as etcdctl, eventually, keys, session};
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

/// A process that resumed its lease after a restart finds a writer key of its previous
/// life under the name (an enqueue etcd applied after the old process gave up on it). Its
/// read does not wait behind that key (nor would anyone else, until the session ends):
/// nothing in this process uses it, so the read removes it and holds at once. Before the
/// fix (found by the simulation, issue 29) the read waited out its whole limit.
#[test]
fn a_resumed_session_removes_its_own_leftover_writer_key() {
    let server = etcd();
    let old = client(&server.endpoints());
    let first = session(&old, 10);
    let lease = first.lease_id();
    // The write enqueue of the old life, applied late: our lease's writer key.
    let stale = format!("leftover/{lease:x}");
    old.put_with_lease(&stale, "", lease).unwrap();
    first.orphan();
    let c = client(&server.endpoints());
    let resumed = c.session_builder().resume(lease).start().unwrap();
    let started = Instant::now();
    let read = resumed
        .rwlock("leftover")
        .unwrap()
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

/// The same rule never touches a key this process uses: a writer of the same session on
/// another thread keeps its key, and the read waits for it like any reader.
#[test]
fn a_read_waits_for_a_live_writer_of_its_own_session() {
    let server = etcd();
    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let writer = s.rwlock("own").unwrap().write().unwrap();
    let reader_session = s.clone();
    let read = std::thread::spawn(move || {
        reader_session
            .rwlock("own")
            .unwrap()
            .read_timeout(Duration::from_millis(800))
            .map(|_| ())
    })
    .join()
    .unwrap();
    assert!(read.as_ref().is_err_and(Error::is_wait_timeout), "{read:?}");
    assert!(writer.is_held(), "the writer's key was left alone");
    assert_eq!(keys(&c, "own/"), vec![writer.key_str().into_owned()]);
}
