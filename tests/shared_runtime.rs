//! Clients built with `shared_runtime(true)` share one runtime thread, and dropping one of
//! them stops its own work only: its connection closes and its keep-alive thread ends
//! while the others go on; the last one stops the shared thread.
//! (Alone in its own test binary so no other test's threads or connections disturb the
//! counts.)

#![cfg(feature = "testing")]

mod common;

use std::time::Duration;

use etcd_sync::Client;

fn os_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Established TCP connections to `port` (IPv4, this network namespace: etcd's own
/// connections to its client port count too, so only differences matter).
fn connections_to(port: u16) -> usize {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return 0;
    };
    // Only this process's sockets: etcd's own gateway dials its client port too, at a
    // moment of its choosing, and the machine's table shows that connection as well.
    let ours: std::collections::BTreeSet<String> = std::fs::read_dir("/proc/self/fd")
        .map(|fds| {
            fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter_map(|link| {
                    let link = link.to_string_lossy().into_owned();
                    let inode = link.strip_prefix("socket:[")?.strip_suffix(']')?;
                    Some(inode.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let remote_port = fields
                .get(2)
                .and_then(|remote| remote.split(':').nth(1))
                .and_then(|hex| u16::from_str_radix(hex, 16).ok());
            remote_port == Some(port)
                && fields.get(3) == Some(&"01")
                && fields.get(9).is_some_and(|inode| ours.contains(*inode))
        })
        .count()
}

fn shared_client(endpoints: &[String]) -> Client {
    Client::builder()
        .endpoints(endpoints)
        .request_timeout(Duration::from_secs(3))
        .shared_runtime(true)
        .connect()
        .expect("connect to the test etcd")
}

#[test]
fn clients_share_one_runtime_thread_and_each_drop_stops_its_own_work() {
    let server = common::etcd();
    let endpoints = server.endpoints();
    let port: u16 = endpoints[0]
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port in the endpoint");
    let (threads_before, conns_before) = (os_threads(), connections_to(port));

    // A client of its own: its runtime thread and its keep-alive thread.
    let own = common::client(&endpoints);
    let own_threads = os_threads() - threads_before;
    drop(own);
    assert!(
        common::eventually(Duration::from_secs(2), || os_threads() == threads_before),
        "threads left by a client of its own"
    );

    let a = shared_client(&endpoints);
    let b = shared_client(&endpoints);
    let two_shared = os_threads() - threads_before;
    assert_eq!(
        two_shared,
        own_threads + 1,
        "two clients on the shared runtime: one runtime thread and a keep-alive thread each \
         ({own_threads} threads for one client of its own)"
    );
    let conns_of_two = connections_to(port);
    assert!(conns_of_two > conns_before, "the clients are connected");

    // Both work, and they exclude each other.
    let (sa, sb) = (common::session(&a, 10), common::session(&b, 10));
    let guard = sa.mutex("shared-rt").unwrap().lock().unwrap();
    let mb = sb.mutex("shared-rt").unwrap();
    assert!(matches!(
        mb.try_lock(),
        Err(etcd_sync::TryLockError::WouldBlock)
    ));
    drop(guard);
    drop(sa);
    // Dropping `a` stops its work only: its connection closes and its keep-alive thread
    // ends, and `b` goes on.
    drop(a);
    assert!(
        common::eventually(Duration::from_secs(3), || connections_to(port)
            < conns_of_two),
        "the dropped client's connection stayed open: {} connections, {conns_of_two} with \
         both",
        connections_to(port)
    );
    assert!(
        common::eventually(Duration::from_secs(2), || os_threads()
            == threads_before + two_shared - 1),
        "the dropped client's keep-alive thread is gone, the shared runtime thread stays: \
         {} threads over the baseline",
        os_threads() - threads_before
    );
    let guard = mb.lock_timeout(Duration::from_secs(5)).unwrap();
    assert!(guard.is_held());
    drop(guard);
    drop(mb);
    drop(sb);
    // The last client stops the shared thread; a new one starts it again.
    drop(b);
    assert!(
        common::eventually(Duration::from_secs(2), || os_threads() == threads_before),
        "threads left after the last shared client was dropped: {} over the baseline",
        os_threads() - threads_before
    );
    assert!(
        common::eventually(Duration::from_secs(3), || connections_to(port)
            == conns_before),
        "connections left after the last shared client was dropped"
    );
    let c = shared_client(&endpoints);
    assert_eq!(os_threads() - threads_before, own_threads);
    match c.get(b"shared-rt/none") {
        Ok(None) => {}
        other => panic!("a new shared runtime serves calls: {other:?}"),
    }
    drop(c);
    assert!(common::eventually(Duration::from_secs(2), || os_threads() == threads_before));
}
