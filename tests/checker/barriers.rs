//! Barriers in the randomized checker (issue 30): two more threads per child, through
//! every fault. The checks are in `barrier_check.rs`.
//!
//! * A **double barrier** of [`DB_COUNT`] on [`DB_NAME`], one participant per child on a
//!   session of its own (so the 3 children make rounds of 2 and a latecomer): enter with a
//!   limit (sometimes cancelled, sometimes `try_enter`), read its own key's stamp (the
//!   round it entered, docs/barriers.md), stay in briefly, and leave with a limit. Lines:
//!   `DB <id> beg <t>`, `DB <id> fail <t> <kind>`, `DB <id> in <t> <round>` (0: not read),
//!   `DB <id> alive <t>` (its session confirmed alive just before leaving, so its key was
//!   still there), `DB <id> leave <t>`, `DB <id> out <t> <ok|kind>`.
//! * A **gate** thread: random `hold`, `release` and `wait_timeout` of the `Barrier`
//!   [`BARRIER_NAME`], and `try_set_count`, `count_down` and `wait_timeout` of the
//!   `CountDownLatch` [`LATCH_NAME`], each logged when it starts (`G <id> <op> <t> [count]`)
//!   and when it returns (`GE <id> <t> <result>`: `1`/`0` for hold, release and set, the
//!   count left for a count-down, `ok` for a wait, else the error's kind).

use std::sync::Mutex as StdMutex;
use std::time::Duration;

use etcd_sync::{CancelToken, Client, TryLockError, WaitOptions};

use super::common::monotonic_ns;
use super::workload::{current_session, error_kind};
use super::{Log, Rng, log};

pub(crate) const DB_NAME: &str = "ck-db";
pub(crate) const DB_COUNT: usize = 2;
pub(crate) const BARRIER_NAME: &str = "ck-bar";
pub(crate) const LATCH_NAME: &str = "ck-latch";
/// The limit of every leave: over the session TTL, so that a partner killed while in is
/// counted out (its key expires with its lease) well before it.
pub(crate) const LEAVE_LIMIT: Duration = Duration::from_secs(8);

/// A child's double-barrier participant, until the deadline.
pub(crate) fn double_worker(
    client: &Client,
    log_file: &Log,
    who: &str,
    deadline_ns: u64,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    let slot = StdMutex::new(None);
    let mut cycles = 0u64;
    while monotonic_ns() < deadline_ns {
        let Some(session) = current_session(client, &slot) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let Ok(barrier) = session.double_barrier(DB_NAME, DB_COUNT) else {
            continue;
        };
        cycles += 1;
        let id = format!("{who}#{cycles}");
        log(log_file, format!("DB {id} beg {}", monotonic_ns()));
        let limit = rng.millis(1_000, 4_000);
        let entered = match rng.below(8) {
            0 => {
                let token = CancelToken::new();
                let (canceller, after) = (token.clone(), rng.millis(0, 2_000));
                std::thread::spawn(move || {
                    std::thread::sleep(after);
                    canceller.cancel();
                });
                barrier.enter_with(WaitOptions::new().timeout(limit).cancel_token(&token))
            }
            1 => match barrier.try_enter() {
                Ok(()) => Ok(()),
                Err(TryLockError::WouldBlock) => {
                    log(log_file, format!("DB {id} fail {} busy", monotonic_ns()));
                    std::thread::sleep(rng.millis(10, 200));
                    continue;
                }
                Err(TryLockError::Error(e)) => Err(e),
            },
            _ => barrier.enter_timeout(limit),
        };
        let at = monotonic_ns();
        if let Err(e) = entered {
            log(log_file, format!("DB {id} fail {at} {}", error_kind(&e)));
            std::thread::sleep(rng.millis(10, 200));
            continue;
        }
        // Our key's stamp names the round we entered with: `<count> <round>`.
        let round = client
            .get_prefix(format!("{DB_NAME}/"))
            .ok()
            .and_then(|kvs| {
                let kv = kvs.into_iter().find(|kv| kv.lease == session.lease_id())?;
                kv.value_str().split(' ').nth(1)?.parse::<i64>().ok()
            })
            .unwrap_or(0);
        log(log_file, format!("DB {id} in {at} {round}"));
        let stay = if rng.below(8) == 0 {
            rng.millis(500, 1_500)
        } else {
            rng.millis(0, 100)
        };
        std::thread::sleep(stay);
        let before = monotonic_ns();
        if session.is_alive() {
            log(log_file, format!("DB {id} alive {before}"));
        }
        log(log_file, format!("DB {id} leave {}", monotonic_ns()));
        let outcome = match barrier.leave_timeout(LEAVE_LIMIT) {
            Ok(()) => "ok",
            Err(e) => error_kind(&e),
        };
        log(
            log_file,
            format!("DB {id} out {} {outcome}", monotonic_ns()),
        );
        std::thread::sleep(rng.millis(0, 100));
    }
}

/// A child's barrier and latch thread, until the deadline.
pub(crate) fn gate_worker(client: &Client, log_file: &Log, who: &str, deadline_ns: u64, seed: u64) {
    let mut rng = Rng::new(seed);
    let (Ok(barrier), Ok(latch)) = (
        client.barrier(BARRIER_NAME),
        client.count_down_latch(LATCH_NAME),
    ) else {
        return;
    };
    let mut ops = 0u64;
    let flag = |r: etcd_sync::Result<bool>| match r {
        Ok(b) => u8::from(b).to_string(),
        Err(e) => error_kind(&e).to_string(),
    };
    let waited = |r: etcd_sync::Result<()>| match r {
        Ok(()) => "ok".to_string(),
        Err(e) => error_kind(&e).to_string(),
    };
    while monotonic_ns() < deadline_ns {
        ops += 1;
        let id = format!("{who}#{ops}");
        let op = rng.below(8);
        let count = 2 + rng.below(2);
        let name = [
            "hold", "release", "bwait", "bwait", "set", "down", "lwait", "lwait",
        ][op as usize];
        log(
            log_file,
            format!("G {id} {name} {} {count}", monotonic_ns()),
        );
        let limit = rng.millis(200, 1_500);
        let result = match op {
            0 => flag(barrier.hold()),
            1 => flag(barrier.release()),
            2 | 3 => waited(barrier.wait_timeout(limit)),
            4 => flag(latch.try_set_count(count)),
            5 => match latch.count_down() {
                Ok(left) => left.to_string(),
                Err(e) => error_kind(&e).to_string(),
            },
            _ => waited(latch.wait_timeout(limit)),
        };
        log(log_file, format!("GE {id} {} {result}", monotonic_ns()));
        std::thread::sleep(rng.millis(30, 250));
    }
}
