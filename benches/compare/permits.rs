//! Issue 30: several permits at once. Beside a mutex's lock + unlock in the same run,
//! interleaved, uncontended: one permit of a semaphore of 4 taken and released, and 3 of
//! them at once (`acquire_many(3)`: one key that weighs 3).

use std::time::{Duration, Instant};

use crate::args::Args;
use crate::stats::{Summary, report};
use crate::{Res, WAIT, connect};

pub fn permits(args: &Args, summary: &mut Summary) -> Res<()> {
    let client = connect(args)?;
    let session = client.session()?;
    let mutex = session.mutex(format!("{}/permits/mutex", args.prefix))?;
    let semaphore = session.semaphore(format!("{}/permits/sem", args.prefix), 4)?;

    let mutex_once = || -> Res<Duration> {
        let t0 = Instant::now();
        mutex.lock_timeout(WAIT)?.release()?;
        Ok(t0.elapsed())
    };
    let permits_once = |k: u32| -> Res<Duration> {
        let t0 = Instant::now();
        let permit = semaphore.acquire_many_timeout(k, WAIT)?;
        if permit.num_permits() != k {
            return Err(format!("asked for {k} permits, got {}", permit.num_permits()).into());
        }
        permit.release()?;
        Ok(t0.elapsed())
    };
    for _ in 0..50 {
        mutex_once()?;
        permits_once(1)?;
        permits_once(3)?;
    }
    let (mut base, mut one, mut three) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..args.n {
        // Rotate the order, so that none always follows another.
        for k in 0..3 {
            match (i + k) % 3 {
                0 => base.push(mutex_once()?),
                1 => one.push(permits_once(1)?),
                _ => three.push(permits_once(3)?),
            }
        }
    }
    let base = report("permits_mutex_lock_unlock", &base, "");
    let one = report("permits_one", &one, "");
    let three = report("permits_three_at_once", &three, "");
    summary.latency("lock + unlock: one Mutex (beside permits)", base);
    summary.latency("Semaphore of 4: acquire + release", one);
    summary.latency("Semaphore of 4: acquire_many(3) + release", three);
    if let (Some(base), Some(one), Some(three)) = (base, one, three) {
        println!(
            "RESULT rust permits one_over_mutex={:.2} three_over_mutex={:.2}",
            one.median / base.median,
            three.median / base.median
        );
        summary.text(format!(
            "at the median, over the Mutex's lock+unlock: one permit {:.2}x, three at once {:.2}x",
            one.median / base.median,
            three.median / base.median
        ));
    }
    session.close()?;
    Ok(())
}
