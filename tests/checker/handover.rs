//! Leadership hand-overs in the randomized checker (issue 53): half the leaderships
//! that end while another session's key waits next in line hand over to it instead of
//! resigning. The next in line may be one of our waiting campaigns (it answers and adopts
//! the leader's key), a `Mutex` or multi-lock waiter, or Go's `etcdctl lock` (neither
//! answers: the hand-over fails within its limit and the leader still leads). Only the
//! next in line as the hand-over itself reads it (`hand_over_next`), so fencing tokens
//! keep growing (a candidate passed over would get a smaller token than its successor:
//! the documented limit of `hand_over` by name, which stop 72's run met when the named
//! key had come back behind another waiter).
//!
//! Log lines:
//!
//! * `LH <name> <rev> <lease> <called> <returned|->`: the hold of the key created at `rev`
//!   went on under `lease` (`-`: the answer was lost, it may apply, or never), for the
//!   outside judge (`linearizable.rs`);
//! * `HO <outcome>`: `ok`, `failed` (`HandOverFailed`: we still lead), or the error's kind;
//! * `HBAD <what>`: a hand-over that broke its promise (a violation).
//!
//! The successor's guard is judged as every guard is (`analysis.rs`: its interval must
//! not overlap the old leader's, its writes come after the old leader's in token order);
//! the old guard's writes under its compares (`ownership_compare` + `lease_compare`) must
//! fail after it (the worker's `STALE` probe).

use etcd_sync::{Leadership, Session, WaitOptions};

use super::common::monotonic_ns;
use super::workload::error_kind;
use super::{Log, Rng, log};

/// Hands `leadership` over to the next in line if that is another session's key; whether
/// it was handed over (the guard no longer leads; its drop deletes nothing).
pub(crate) fn hand_over_next(
    session: &Session,
    name: &str,
    leadership: &Leadership,
    log_file: &Log,
    rng: &mut Rng,
) -> bool {
    let Ok(status) = session.election(name).and_then(|e| e.status()) else {
        return false;
    };
    let lease = session.lease_id();
    let ours = status.holder().is_some_and(|h| h.lease == lease);
    let next = status.waiters.into_iter().next();
    let Some(to) = next.filter(|w| ours && w.lease != lease && w.lease != 0) else {
        return false;
    };
    let rev = leadership.create_revision();
    let called = monotonic_ns();
    // The first in line as the hand-over reads it: `to`'s key may have been deleted and
    // created again behind another since the read above (stop 72, seed 47053219180389),
    // and a hand-over by its name would pass the other over.
    let options = WaitOptions::new().timeout(rng.millis(100, 1_500));
    match leadership.hand_over_next_with(options) {
        Ok(next) => {
            let returned = monotonic_ns();
            log(
                log_file,
                format!("LH {name} {rev} {} {called} {returned}", next.lease),
            );
            log(log_file, "HO ok".to_string());
            let mut wrong = Vec::new();
            if leadership.is_leader() {
                wrong.push("still leads".to_string());
            }
            let lost = leadership.lost().try_recv();
            if lost != Err(crossbeam_channel::TryRecvError::Disconnected) {
                wrong.push("its lost() did not fire".to_string());
            }
            if next.key != leadership.key() || next.lease == lease || next.lease == 0 {
                wrong.push(format!(
                    "the successor holds {} on lease {:x}, ours {lease:x}",
                    next.key_str(),
                    next.lease,
                ));
            }
            for what in wrong {
                log(log_file, format!("HBAD {name} rev {rev}: {what}"));
            }
            true
        }
        Err(e) if e.is_hand_over_failed() => {
            log(log_file, "HO failed".to_string());
            false
        }
        Err(e) => {
            // Cut short: the adoption may have been on its way (it applies, or never), to
            // the next in line: `to`, unless our key already shows another lease (`to`'s
            // key came back behind another waiter, who was next).
            let now = session.client().get(leadership.key()).ok().flatten();
            let went = now
                .filter(|kv| kv.create_revision == rev && kv.lease != lease && kv.lease != 0)
                .map_or(to.lease, |kv| kv.lease);
            log(log_file, format!("LH {name} {rev} {went} {called} -"));
            log(log_file, format!("HO {}", error_kind(&e)));
            false
        }
    }
}

/// The hand-overs of a run: outcomes counted, and what went wrong.
#[derive(Debug, Default)]
pub(crate) struct Totals {
    pub(crate) outcomes: std::collections::BTreeMap<String, u64>,
    pub(crate) bad: Vec<String>,
}

/// Reads every child's `HO` and `HBAD` lines.
pub(crate) fn parse(dir: &std::path::Path, files: usize) -> Totals {
    let mut totals = Totals::default();
    super::processes::each_log_line(dir, files, |n, line| {
        if let Some(outcome) = line.strip_prefix("HO ") {
            *totals.outcomes.entry(outcome.to_string()).or_default() += 1;
        } else if let Some(what) = line.strip_prefix("HBAD ") {
            totals.bad.push(format!("hand-over: {what} (log-{n})"));
        }
    });
    totals
}
