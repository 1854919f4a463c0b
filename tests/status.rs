//! Who holds what, against real etcd: session identities stored in lock keys, the
//! recipes' `status()` (holders, then waiters or candidates, in line order), and `Client::status` of a lock
//! taken by the real `etcdctl lock`.

#![cfg(feature = "testing")]

mod common;

use std::time::Duration;

use common::{ChildGuard, client, etcd, etcdctl_command, eventually, hostname, keys, session};
use etcd_sync::{Error, Holder, KeyMode, MAX_IDENTITY_LEN, Session};

const TTL: u64 = 10;
const WAIT: Duration = Duration::from_secs(10);

/// Asserts that `key` is the key of `session` with this fencing token, a live lease and
/// `identity` as its value.
fn assert_key(key: &Holder, session: &Session, token: Option<i64>, identity: &str) {
    assert_eq!(key.lease, session.lease_id(), "{key:?}");
    assert!(
        key.key_str().contains(&format!("{:x}", session.lease_id())),
        "{key:?}"
    );
    if let Some(token) = token {
        assert_eq!(key.create_revision, token, "{key:?}");
    }
    assert_eq!(key.identity().as_deref(), Some(identity), "{key:?}");
    let ttl = key.ttl.expect("a live lease has a TTL");
    assert!(
        ttl > Duration::ZERO && ttl <= Duration::from_secs(TTL),
        "{ttl:?}"
    );
}

#[test]
fn mutex_reports_its_holder_and_waiters_in_line_order() {
    let server = etcd();
    let c = client(&server.endpoints());
    let first = session(&c, TTL);
    let second = c
        .session_builder()
        .ttl(Duration::from_secs(TTL))
        .identity("worker-2")
        .start()
        .unwrap();
    let third = session(&c, TTL);
    let default_identity = format!("{}:{}", hostname(), std::process::id());
    assert_eq!(first.identity(), default_identity);
    assert_eq!(second.identity(), "worker-2");

    let mutex = first.mutex("m").unwrap();
    assert_eq!(mutex.status().unwrap().holder(), None, "free");
    assert!(mutex.status().unwrap().waiters.is_empty());
    let guard = mutex.lock().unwrap();
    // Queue the others one at a time so that their order is known.
    let mut waiting = Vec::new();
    for (i, s) in [&second, &third].into_iter().enumerate() {
        let m = s.mutex("m").unwrap();
        waiting.push(std::thread::spawn(move || m.lock()));
        assert!(eventually(WAIT, || keys(&c, "m/").len() == i + 2));
    }

    let holder = mutex.status().unwrap().holder().cloned().expect("a holder");
    assert_key(
        &holder,
        &first,
        Some(guard.fencing_token()),
        &default_identity,
    );
    assert_eq!(holder.key, guard.key());
    assert_eq!(holder.mode, KeyMode::Exclusive);
    let waiters = third.mutex("m").unwrap().status().unwrap().waiters;
    assert_eq!(waiters.len(), 2, "{waiters:?}");
    assert_key(&waiters[0], &second, None, "worker-2");
    assert_key(&waiters[1], &third, None, &default_identity);
    assert!(holder.create_revision < waiters[0].create_revision);
    assert!(waiters[0].create_revision < waiters[1].create_revision);

    let status = c.status("m").unwrap();
    assert_eq!(status.name, b"m");
    assert!(status.is_held());
    assert_eq!(status.holders, vec![holder.clone()]);
    assert_eq!(
        status.waiters.iter().map(|w| w.lease).collect::<Vec<_>>(),
        vec![second.lease_id(), third.lease_id()]
    );

    // The next in line takes over, with its own identity and fencing token.
    drop(guard);
    let next = waiting.remove(0).join().unwrap().unwrap();
    let holder = mutex
        .status()
        .unwrap()
        .holder()
        .cloned()
        .expect("the second holds");
    assert_key(&holder, &second, Some(next.fencing_token()), "worker-2");
    assert_eq!(mutex.status().unwrap().waiters.len(), 1);
    drop(next);
    drop(waiting.remove(0).join().unwrap().unwrap());
    assert_eq!(mutex.status().unwrap().holder(), None);
}

#[test]
fn semaphore_reports_its_permit_holders_and_waiters() {
    let server = etcd();
    let c = client(&server.endpoints());
    let sessions: Vec<Session> = (0..3).map(|_| session(&c, TTL)).collect();
    let permits: Vec<_> = sessions[..2]
        .iter()
        .map(|s| s.semaphore("sem", 2).unwrap().acquire().unwrap())
        .collect();
    let last = sessions[2].semaphore("sem", 2).unwrap();
    let waiting = {
        let last = last.clone();
        std::thread::spawn(move || last.acquire())
    };
    assert!(eventually(WAIT, || keys(&c, "sem/").len() == 3));

    let holders = last.status().unwrap().holders;
    assert_eq!(holders.len(), 2, "{holders:?}");
    for ((holder, permit), s) in holders.iter().zip(&permits).zip(&sessions) {
        assert_key(holder, s, Some(permit.fencing_token()), s.identity());
        assert_eq!(holder.mode, KeyMode::Permits(2));
    }
    let waiters = last.status().unwrap().waiters;
    assert_eq!(waiters.len(), 1, "{waiters:?}");
    assert_key(&waiters[0], &sessions[2], None, sessions[2].identity());
    assert_eq!(waiters[0].mode, KeyMode::Permits(2));

    drop(permits);
    let permit = waiting.join().unwrap().unwrap();
    let holders = last.status().unwrap().holders;
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].create_revision, permit.fencing_token());
    assert!(last.status().unwrap().waiters.is_empty());
}

#[test]
fn rwlock_reports_the_readers_or_the_writer() {
    let server = etcd();
    let c = client(&server.endpoints());
    let [r1, r2, w, r3]: [Session; 4] = std::array::from_fn(|_| session(&c, TTL));
    let reads = [
        r1.rwlock("rw").unwrap().read().unwrap(),
        r2.rwlock("rw").unwrap().read().unwrap(),
    ];
    let writer = {
        let lock = w.rwlock("rw").unwrap();
        std::thread::spawn(move || lock.write())
    };
    assert!(eventually(WAIT, || keys(&c, "rw/").len() == 3));
    // A reader behind a waiting writer waits for it.
    let late_reader = {
        let lock = r3.rwlock("rw").unwrap();
        std::thread::spawn(move || lock.read())
    };
    assert!(eventually(WAIT, || keys(&c, "rw/").len() == 4));

    let lock = r1.rwlock("rw").unwrap();
    let holders = lock.status().unwrap().holders;
    assert_eq!(holders.len(), 2, "{holders:?}");
    for ((holder, read), s) in holders.iter().zip(&reads).zip([&r1, &r2]) {
        assert_key(holder, s, Some(read.fencing_token()), s.identity());
        assert_eq!(holder.mode, KeyMode::Shared);
    }
    let waiters = lock.status().unwrap().waiters;
    assert_eq!(
        waiters
            .iter()
            .map(|k| (k.lease, k.mode))
            .collect::<Vec<_>>(),
        vec![
            (w.lease_id(), KeyMode::Exclusive),
            (r3.lease_id(), KeyMode::Shared)
        ]
    );

    drop(reads);
    let write = writer.join().unwrap().unwrap();
    let holders = lock.status().unwrap().holders;
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_key(&holders[0], &w, Some(write.fencing_token()), w.identity());
    assert_eq!(holders[0].mode, KeyMode::Exclusive);
    assert_eq!(lock.status().unwrap().waiters.len(), 1);
    drop(write);
    drop(late_reader.join().unwrap().unwrap());
}

#[test]
fn election_lists_its_candidates_after_the_leader() {
    let server = etcd();
    let c = client(&server.endpoints());
    let [s1, s2, s3]: [Session; 3] = std::array::from_fn(|_| session(&c, TTL));
    let election = s1.election("e").unwrap();
    let leadership = election.campaign("leader-value").unwrap();
    let mut campaigns = Vec::new();
    for (i, (s, value)) in [(&s2, "second"), (&s3, "third")].into_iter().enumerate() {
        let e = s.election("e").unwrap();
        campaigns.push(std::thread::spawn(move || e.campaign(value)));
        assert!(eventually(WAIT, || keys(&c, "e/").len() == i + 2));
    }

    assert_eq!(
        election.leader().unwrap().map(|l| l.value),
        Some(b"leader-value".to_vec())
    );
    let candidates = election.status().unwrap().waiters;
    assert_eq!(candidates.len(), 2, "{candidates:?}");
    // Election keys keep the campaign value, not the session identity.
    assert_key(&candidates[0], &s2, None, "second");
    assert_key(&candidates[1], &s3, None, "third");
    let status = c.status("e").unwrap();
    assert_eq!(status.holders.len(), 1);
    assert_key(
        &status.holders[0],
        &s1,
        Some(leadership.fencing_token()),
        "leader-value",
    );
    assert_eq!(status.waiters, candidates);

    drop(leadership);
    let next = campaigns.remove(0).join().unwrap().unwrap();
    assert_eq!(election.status().unwrap().waiters.len(), 1);
    drop(next);
    drop(campaigns.remove(0).join().unwrap().unwrap());
    assert!(election.status().unwrap().waiters.is_empty());
}

#[test]
fn status_of_an_etcdctl_lock_has_no_identity() {
    let server = etcd();
    let c = client(&server.endpoints());
    let free = c.status("ctl").unwrap();
    assert!(!free.is_held() && free.waiters.is_empty(), "{free:?}");

    let mut etcdctl = ChildGuard::spawn(etcdctl_command(&server.endpoint(), &["lock", "ctl"]));
    assert!(eventually(WAIT, || keys(&c, "ctl/").len() == 1));
    let s = session(&c, TTL);
    let waiting = {
        let m = s.mutex("ctl").unwrap();
        std::thread::spawn(move || m.lock())
    };
    assert!(eventually(WAIT, || keys(&c, "ctl/").len() == 2));

    let status = c.status("ctl").unwrap();
    assert_eq!(status.holders.len(), 1, "{status:?}");
    let theirs = &status.holders[0];
    assert_eq!(theirs.identity(), None, "etcdctl stores no value");
    assert_eq!(theirs.mode, KeyMode::Exclusive);
    assert_ne!(theirs.lease, 0);
    assert!(theirs.ttl.is_some_and(|t| t > Duration::ZERO), "{theirs:?}");
    assert_eq!(status.waiters.len(), 1);
    assert_key(&status.waiters[0], &s, None, s.identity());

    // SIGINT: etcdctl releases (revokes its session), and we hold.
    unsafe { libc::kill(etcdctl.child().id() as i32, libc::SIGINT) };
    let _ = etcdctl.child().wait();
    let guard = waiting.join().unwrap().unwrap();
    let status = c.status("ctl").unwrap();
    assert_eq!(status.holders.len(), 1);
    assert_key(
        &status.holders[0],
        &s,
        Some(guard.fencing_token()),
        s.identity(),
    );
    assert!(status.waiters.is_empty());
}

#[test]
fn a_key_without_a_lease_holds_as_other_and_has_no_ttl() {
    let server = etcd();
    let c = client(&server.endpoints());
    c.put("d/data", "x").unwrap();
    let status = c.status("d").unwrap();
    assert_eq!(status.holders.len(), 1);
    let data = &status.holders[0];
    assert_eq!((data.mode, data.lease, data.ttl), (KeyMode::Other, 0, None));
    assert_eq!(data.identity().as_deref(), Some("x"));
    assert!(matches!(c.status(""), Err(Error::InvalidArgument(_))));
}

#[test]
fn a_bad_identity_is_an_invalid_argument() {
    let server = etcd();
    let c = client(&server.endpoints());
    for bad in [
        String::new(),
        "x".repeat(MAX_IDENTITY_LEN + 1),
        "two\nlines".into(),
    ] {
        let started = c.session_builder().identity(bad.clone()).start();
        assert!(
            matches!(started, Err(Error::InvalidArgument(_))),
            "{bad:?}: {started:?}"
        );
    }
    let longest = "x".repeat(MAX_IDENTITY_LEN);
    let s = c
        .session_builder()
        .identity(longest.clone())
        .start()
        .unwrap();
    let guard = s.mutex("id").unwrap().lock().unwrap();
    assert_eq!(
        c.get(guard.key()).unwrap().unwrap().value,
        longest.as_bytes()
    );
}
