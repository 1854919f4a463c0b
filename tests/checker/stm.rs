//! Software transactions in the randomized checker (issue 30): one thread per child runs
//! `Client::stm` transactions on the `ck-stm/` keys through every fault, at a random
//! isolation level that checks its reads and a random retry bound: increments of one
//! counter, and transfers between two accounts (some prefetched). Each transaction is
//! logged when it starts and when it ends (`STM <increment|transfer> <start|ok|conflict|
//! error>`). The parent then checks:
//!
//! * no increment was lost: the counter is at least the increments that committed, and at
//!   most those plus the ones whose outcome is unknown (an error, so the commit may or may
//!   not have applied, or a child killed mid-transaction);
//! * transfers are atomic: the two accounts sum to zero.

use std::time::Duration;

use etcd_sync::{Client, Error, Isolation, StmTx};

use super::common::monotonic_ns;
use super::{Log, Rng, log};

const COUNTER: &str = "ck-stm/counter";
const ACCOUNTS: [&str; 2] = ["ck-stm/a", "ck-stm/b"];

fn number(tx: &mut StmTx<'_>, key: &str) -> etcd_sync::Result<i64> {
    Ok(tx
        .get(key)?
        .and_then(|v| String::from_utf8(v).ok()?.parse().ok())
        .unwrap_or(0))
}

/// A child's STM thread: transactions until the deadline.
pub(crate) fn worker(client: &Client, log_file: &Log, deadline_ns: u64, seed: u64) {
    let mut rng = Rng::new(seed);
    while monotonic_ns() < deadline_ns {
        let levels = [
            Isolation::SerializableSnapshot,
            Isolation::Serializable,
            Isolation::RepeatableReads,
        ];
        let mut stm = client
            .stm_builder()
            .isolation(levels[rng.below(3) as usize]);
        if rng.below(2) == 0 {
            stm = stm.max_retries(rng.below(4) as u32);
        }
        let transfer = rng.below(2) == 0;
        if transfer && rng.below(2) == 0 {
            stm = stm.prefetch(ACCOUNTS);
        }
        let op = if transfer { "transfer" } else { "increment" };
        let amount = rng.below(10) as i64 + 1;
        log(log_file, format!("STM {op} start"));
        let result = if transfer {
            stm.run(|tx| {
                let (a, b) = (number(tx, ACCOUNTS[0])?, number(tx, ACCOUNTS[1])?);
                tx.put(ACCOUNTS[0], (a - amount).to_string());
                tx.put(ACCOUNTS[1], (b + amount).to_string());
                Ok::<_, Error>(())
            })
        } else {
            stm.run(|tx| {
                let n = number(tx, COUNTER)?;
                tx.put(COUNTER, (n + 1).to_string());
                Ok::<_, Error>(())
            })
        };
        let outcome = match result {
            Ok(()) => "ok",
            Err(e) if e.is_conflict() => "conflict",
            // A commit without an answer may or may not have applied.
            Err(_) => "error",
        };
        log(log_file, format!("STM {op} {outcome}"));
        std::thread::sleep(rng.millis(10, 60));
    }
}

/// What the children's logs say of their transactions.
#[derive(Debug, Default)]
pub(crate) struct Totals {
    pub(crate) increments_ok: u64,
    /// Increments that may or may not have applied.
    pub(crate) increments_unknown: u64,
    pub(crate) transfers_ok: u64,
    pub(crate) conflicts: u64,
    pub(crate) errors: u64,
}

/// Reads the STM lines of the children's logs `log-1` to `log-<files>`.
pub(crate) fn parse(dir: &std::path::Path, files: usize) -> Totals {
    let mut totals = Totals::default();
    for n in 1..=files {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("log-{n}"))) else {
            continue;
        };
        let mut pending_increment = false;
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let [tag, op, outcome] = f[..] else {
                continue; // not ours, or cut by SIGKILL
            };
            if tag != "STM" {
                continue;
            }
            let increment = op == "increment";
            match outcome {
                "start" => pending_increment = increment,
                "ok" if increment => totals.increments_ok += 1,
                "ok" => totals.transfers_ok += 1,
                "conflict" => totals.conflicts += 1,
                _ => {
                    totals.errors += 1;
                    totals.increments_unknown += u64::from(increment);
                }
            }
            if outcome != "start" {
                pending_increment = false;
            }
        }
        // A child killed between an increment's start and its end.
        totals.increments_unknown += u64::from(pending_increment);
    }
    totals
}

/// The invariants above, against what etcd holds now; one line per violation.
pub(crate) fn check(c: &Client, totals: &Totals) -> Vec<String> {
    let read = |key: &str| -> Result<i64, String> {
        let mut last = String::new();
        for _ in 0..10 {
            match c.get(key) {
                Ok(kv) => return Ok(kv.map_or(0, |kv| kv.value_str().parse().unwrap_or(i64::MIN))),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(format!("STM: cannot read {key}: {last}"))
    };
    let mut violations = Vec::new();
    match read(COUNTER) {
        Ok(counter) => {
            let (low, high) = (
                totals.increments_ok as i64,
                (totals.increments_ok + totals.increments_unknown) as i64,
            );
            if counter < low || counter > high {
                violations.push(format!(
                    "STM: counter {counter} outside [{low}, {high}] (committed increments, plus \
                     those of unknown outcome): {totals:?}"
                ));
            }
        }
        Err(e) => violations.push(e),
    }
    match (read(ACCOUNTS[0]), read(ACCOUNTS[1])) {
        (Ok(a), Ok(b)) if a.checked_add(b) != Some(0) => violations.push(format!(
            "STM: the accounts hold {a} and {b}, not a sum of 0 (a transfer lost or half applied)"
        )),
        (Err(e), _) | (_, Err(e)) => violations.push(e),
        _ => {}
    }
    violations
}
