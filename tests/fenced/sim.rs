//! The simulation's history (`Outcome::history`) as the fenced lock's operations.

use etcd_sync::testing::sim::{Mode as SimMode, Operation, Outcome, What};

use super::{Event, Mode, Op, Ret, Verdict};

/// Search steps per window: a simulated schedule has tens of operations per name.
pub const BUDGET: u64 = 2_000_000;

/// One schedule's check in all: past it, windows left are undecided.
pub const LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// One simulated operation.
pub fn event(operation: &Operation) -> Event {
    let (op, ret) = match operation.what {
        What::Acquire { mode, lease, token } => {
            let mode = match mode {
                SimMode::Exclusive => Mode::Exclusive,
                SimMode::Shared => Mode::Shared,
                SimMode::Permit(of) => Mode::Permits { of, take: 1 },
            };
            (Op::Acquire { mode, lease }, Ret::Acquired(token))
        }
        What::Release {
            token,
            lease,
            deleted,
        } => {
            let ret = if deleted { Ret::Released } else { Ret::Gone };
            let lease = Some(lease);
            (Op::Release { token, lease }, ret)
        }
        What::Observe { token, present } => {
            let ret = if present { Ret::Present } else { Ret::Absent };
            (Op::Observe(token), ret)
        }
        What::Downgrade { token } => (Op::Downgrade(token), Ret::Done),
        What::Remove { token } => (Op::Remove(token), Ret::Done),
        What::RemoveAll => (Op::RemoveAll, Ret::Done),
        What::EndLease { lease } => (Op::EndLease(lease), Ret::Done),
        What::Crashed { lease, upto } => (Op::LeaseKeys { lease, upto }, Ret::Done),
        What::HandOver { token, lease } => (Op::HandOver { token, to: lease }, Ret::Done),
    };
    Event {
        name: operation.name.map(str::to_string),
        op,
        ret,
        called: operation.called,
        returned: operation.returned,
    }
}

/// Checks one schedule's history.
pub fn check(outcome: &Outcome) -> Verdict {
    super::check(outcome.history.iter().map(event).collect(), BUDGET, LIMIT)
}

/// Checks it again with ten times the steps and six times the time: a schedule left
/// undecided on a busy machine gets one more chance before it counts against the run.
pub fn check_longer(outcome: &Outcome) -> Verdict {
    let events = outcome.history.iter().map(event).collect();
    super::check(events, BUDGET * 10, LIMIT * 6)
}
