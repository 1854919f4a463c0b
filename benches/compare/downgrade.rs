//! Issue 30: going from write to read with no gap. Beside a mutex's lock + unlock and a
//! plain write + release in the same run, interleaved: a downgradable write (two keys in
//! one Txn), its downgrade (one Txn) and the read's release, and the downgrade alone.

use std::time::{Duration, Instant};

use crate::args::Args;
use crate::stats::{Summary, report};
use crate::{Res, WAIT, connect};

pub fn downgrade(args: &Args, summary: &mut Summary) -> Res<()> {
    let client = connect(args)?;
    let session = client.session()?;
    let mutex = session.mutex(format!("{}/downgrade/mutex", args.prefix))?;
    let rwlock = session.rwlock(format!("{}/downgrade/rw", args.prefix))?;

    let mutex_once = || -> Res<Duration> {
        let t0 = Instant::now();
        mutex.lock_timeout(WAIT)?.release()?;
        Ok(t0.elapsed())
    };
    let write_once = || -> Res<Duration> {
        let t0 = Instant::now();
        rwlock.write_timeout(WAIT)?.release()?;
        Ok(t0.elapsed())
    };
    let downgrade_once = || -> Res<(Duration, Duration)> {
        let t0 = Instant::now();
        let write = rwlock.write_downgradable_timeout(WAIT)?;
        let t1 = Instant::now();
        let read = write
            .downgrade()
            .map_err(etcd_sync::DowngradeError::into_error)?;
        let t2 = Instant::now();
        read.release()?;
        Ok((t0.elapsed(), t2 - t1))
    };
    for _ in 0..50 {
        mutex_once()?;
        write_once()?;
        downgrade_once()?;
    }
    let (mut base, mut write, mut whole, mut step) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..args.n {
        // Rotate the order, so that none always follows another.
        for k in 0..3 {
            match (i + k) % 3 {
                0 => base.push(mutex_once()?),
                1 => write.push(write_once()?),
                _ => {
                    let (w, d) = downgrade_once()?;
                    whole.push(w);
                    step.push(d);
                }
            }
        }
    }
    let base = report("downgrade_mutex_lock_unlock", &base, "");
    let plain = report("downgrade_plain_write", &write, "");
    let all = report("downgrade_write_downgrade_release", &whole, "");
    let alone = report("downgrade_alone", &step, "");
    summary.latency("lock + unlock: one Mutex (beside downgrades)", base);
    summary.latency("RwLock write + release", plain);
    summary.latency("write_downgradable + downgrade + read release", all);
    summary.latency("downgrade alone (one Txn)", alone);
    if let (Some(base), Some(plain), Some(all), Some(alone)) = (base, plain, all, alone) {
        println!(
            "RESULT rust downgrade plain_write_over_mutex={:.2} whole_over_mutex={:.2} \
             downgrade_over_mutex={:.2}",
            plain.median / base.median,
            all.median / base.median,
            alone.median / base.median
        );
        summary.text(format!(
            "at the median, over the Mutex's lock+unlock: plain write {:.2}x, downgradable \
             write + downgrade + read release {:.2}x, the downgrade alone {:.2}x",
            plain.median / base.median,
            all.median / base.median,
            alone.median / base.median
        ));
    }
    session.close()?;
    Ok(())
}
