//! (e): handoff latency with W waiters queued on one name (all sharing one client).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::args::Args;
use crate::handoff_floor::over_floor;
use crate::metrics::{Counters, counters};
use crate::stats::{Summary, report, tail};
use crate::turns::{Turns, locked};
use crate::{Res, WAIT, connect, join_bounded};

pub fn scaling_one(args: &Args, waiters: usize, summary: &mut Summary) -> Res<()> {
    let client = connect(args)?;
    let name = format!("{}/scaling/{waiters}", args.prefix);
    let gate_session = client.session()?;
    let gate = gate_session.mutex(&name)?.lock_timeout(WAIT)?;
    // W waiters queued behind every holder: W + 1 participants take turns; a holder keeps
    // the lock for `hold` so that the previous holder is back in line (queued and watching)
    // before the next handoff.
    let participants = waiters + 1;
    let mut sessions = Vec::with_capacity(participants);
    for _ in 0..participants {
        sessions.push(client.session()?);
    }
    let turns = Arc::new(Turns::new());
    let samples = Arc::new(StdMutex::new(Vec::new()));
    let acquisitions = Arc::new(AtomicU64::new(0));
    // etcd's counters and the acquisition count when the last wanted sample was taken.
    let at_stop = Arc::new(StdMutex::new(None::<(Counters, u64)>));
    let warmup = 5usize;
    let wanted = warmup + args.handoffs;
    let hold = args.hold;
    let mut handles = Vec::new();
    for (me, session) in sessions.iter().enumerate() {
        let mutex = session.mutex(&name)?;
        let (turns, samples, acquisitions, at_stop) = (
            turns.clone(),
            samples.clone(),
            acquisitions.clone(),
            at_stop.clone(),
        );
        let endpoint = args.endpoints[0].clone();
        handles.push(thread::spawn(move || {
            while !turns.stop.load(Ordering::SeqCst) {
                let guard = match mutex.lock_timeout(WAIT) {
                    Ok(g) => g,
                    Err(e) => return turns.error(format!("waiter {me}: lock: {e}")),
                };
                acquisitions.fetch_add(1, Ordering::SeqCst);
                let acquired = Instant::now();
                if turns.stop.load(Ordering::SeqCst) {
                    drop(guard);
                    return;
                }
                if let Some(h) = turns.enter(me, guard.fencing_token(), acquired) {
                    let mut s = locked(&samples);
                    s.push(h);
                    if s.len() >= wanted && !turns.stop.swap(true, Ordering::SeqCst) {
                        let n = acquisitions.load(Ordering::SeqCst);
                        if let Ok(c) = counters(&endpoint) {
                            *locked(&at_stop) = Some((c, n));
                        }
                    }
                }
                thread::sleep(hold);
                turns.leave(me);
                if let Err(e) = guard.release() {
                    return turns.error(format!("waiter {me}: unlock: {e}"));
                }
            }
        }));
    }
    // Everyone queued (gate holder + participants), then give the watches time to start.
    let prefix = format!("{name}/");
    let queued_by = Instant::now() + WAIT;
    loop {
        let queued = client.get_prefix(&prefix)?.len();
        if queued > participants {
            break;
        }
        if Instant::now() > queued_by || turns.stop.load(Ordering::SeqCst) {
            turns.error(format!("only {queued} of {} keys queued", participants + 1));
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_millis(300));
    *locked(&turns.slot) = Some((Instant::now(), usize::MAX));
    let before = counters(&args.endpoints[0]).ok();
    gate.release()?;
    let deadline = Instant::now() + WAIT * 4 + hold * (wanted as u32 + participants as u32);
    let left = join_bounded(handles, deadline);
    if left > 0 {
        turns.error(format!("{left} waiters still running at the deadline"));
    }
    let stopped = locked(&at_stop).take();
    if let (Some(b), Some((a, n))) = (before, stopped) {
        // Every request from the gate's release to the last measured handoff (waiters
        // joining again, waiting, reading, releasing), per acquisition.
        println!(
            "RESULT rust scaling_cost_waiters_{waiters} {} n={n}",
            a.minus(&b).per_op(n as usize)
        );
    }
    let errors = turns.take_errors();
    for e in &errors {
        eprintln!("scaling {waiters}: {e}");
    }
    let all = std::mem::take(&mut *locked(&samples));
    let measured: Vec<Duration> = all.iter().skip(warmup).copied().collect();
    let st = report(
        &format!("handoff_waiters_{waiters}"),
        &measured,
        &format!(
            "waiters={waiters} violations={} errors={} {}",
            turns.violations.load(Ordering::SeqCst),
            errors.len(),
            tail(&measured)
        ),
    );
    summary.latency(&format!("handoff, {waiters} waiters queued"), st);
    summary.keep(&format!("handoff_waiters_{waiters}"), st);
    over_floor(
        &format!("handoff_waiters_{waiters}_over_floor"),
        st,
        &format!("waiters={waiters}"),
        summary,
    );
    for s in &sessions {
        let _ = s.close();
    }
    let _ = gate_session.close();
    if !errors.is_empty() {
        return Err(format!("scaling {waiters}: {} errors", errors.len()).into());
    }
    Ok(())
}

/// The smallest and the largest queue length measured, and the handoff median of the
/// largest divided by that of the smallest.
pub fn growth_ratio(args: &Args, summary: &Summary) -> Option<(usize, usize, f64)> {
    let from = *args.waiters.iter().min()?;
    let to = *args.waiters.iter().max()?;
    let a = summary.figure(&format!("handoff_waiters_{from}"))?;
    let b = summary.figure(&format!("handoff_waiters_{to}"))?;
    (from != to).then(|| (from, to, b.median / a.median))
}

/// Prints `RESULT rust handoff_waiters_growth median_ratio=..`: the handoff median with the
/// longest queue measured divided by that with the shortest (issue #12: 256 ÷ 2).
pub fn growth(args: &Args, summary: &Summary) {
    if let Some((from, to, ratio)) = growth_ratio(args, summary) {
        let p90 = |w: usize| {
            summary
                .figure(&format!("handoff_waiters_{w}"))
                .map(|s| s.p90)
        };
        let p90_ratio = p90(to).zip(p90(from)).map_or(0.0, |(b, a)| b / a);
        println!(
            "RESULT rust handoff_waiters_growth median_ratio={ratio:.3} p90_ratio={p90_ratio:.3} \
             waiters_from={from} waiters_to={to}"
        );
    }
}
