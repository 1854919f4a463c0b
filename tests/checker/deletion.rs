//! The key-deletion mode: held keys of every kind deleted with `etcdctl del`, one at a time
//! on a quiet single member, must fire `lost()` within one second every time. (The main run
//! mixes operator deletes into its faults; this mode covers every guard kind each run.)
//! Half the rounds ask the holder to let go first: its request key must go with the forced
//! release; a downgradable write downgraded right after the delete must fail with
//! `LockLost` (issue 48).

use std::time::{Duration, Instant};

use super::Rng;
use super::common::{self, CHILD_ROLE, monotonic_ns};
use super::workload::Guard;

/// The key-deletion mode: held keys deleted with `etcdctl del` must fire `lost()` within
/// one second, every time, for locks and leaderships.
#[test]
fn key_deletion_fires_lost_within_a_second() {
    if std::env::var(CHILD_ROLE).is_ok() {
        return;
    }
    let seed: u64 = std::env::var("CHECKER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| monotonic_ns() | 1);
    println!("KEY-DELETION seed={seed}");
    let mut rng = Rng::new(seed);
    let server = common::etcd();
    let c = common::client(&server.endpoints());
    let session = common::session(&c, 30);
    let etcdctl = etcd_sync::testing::etcdctl_binary().expect("etcdctl");
    let mut worst = Duration::ZERO;
    let rounds = 20;
    for round in 0..rounds {
        let name = format!("del-{}", rng.below(3));
        let guard = match rng.below(6) {
            0 => Guard::Lock(session.mutex(&name).unwrap().lock().unwrap()),
            1 => Guard::Lead(session.election(&name).unwrap().campaign("v").unwrap()),
            2 => Guard::Read(session.rwlock(&name).unwrap().read().unwrap()),
            3 => Guard::Write(session.rwlock(&name).unwrap().write().unwrap()),
            4 => Guard::Write(session.rwlock(&name).unwrap().write_downgradable().unwrap()),
            _ => Guard::Permit(session.semaphore(&name, 2).unwrap().acquire().unwrap()),
        };
        let (key, lost) = (guard.key(), guard.lost());
        let asked = rng.below(2) == 0;
        if asked {
            assert!(!c.request_release(&name).unwrap().is_empty());
        }
        std::thread::sleep(rng.millis(0, 50));
        let deleted_at = Instant::now();
        let out = std::process::Command::new(&etcdctl)
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &server.endpoint(), "del", &key])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let guard = match guard {
            Guard::Write(w) if w.is_downgradable() => {
                let e = w.downgrade().map(|_| ()).unwrap_err();
                let lock_lost = matches!(e.error(), etcd_sync::Error::LockLost);
                assert!(
                    lock_lost,
                    "seed {seed} round {round}: downgrade after del: {e:?}"
                );
                None
            }
            guard => Some(guard),
        };
        match lost.recv_timeout(Duration::from_secs(1)) {
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {}
            other => panic!("seed {seed} round {round}: lost() did not fire within 1 s: {other:?}"),
        }
        worst = worst.max(deleted_at.elapsed());
        assert!(
            guard.is_none_or(|g| !g.is_held()),
            "seed {seed} round {round}"
        );
        assert!(session.is_alive());
        let requests = format!("{name}.revoke/");
        let gone = || c.get_prefix(&requests).is_ok_and(|kvs| kvs.is_empty());
        assert!(
            common::eventually(Duration::from_secs(2), gone),
            "seed {seed} round {round} (asked: {asked}): a release request outlived the forced release"
        );
    }
    println!("KEY-DELETION rounds={rounds} worst_lost_latency={worst:?}");
}
