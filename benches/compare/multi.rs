//! Issue 30: several locks at once. Uncontended: lock + unlock of a `MultiLock` of 2 and of
//! 4 names beside a single `Mutex`, interleaved in one run so drift hits all three alike.
//! Contended: two processes (each its own client) taking the same names in opposite orders
//! for 3 s, beside two taking one mutex, in acquisitions per second.

use std::time::{Duration, Instant};

use etcd_sync::MultiLock;

use crate::args::Args;
use crate::stats::{Summary, report};
use crate::{Res, WAIT, connect};

pub fn multi(args: &Args, summary: &mut Summary) -> Res<()> {
    let client = connect(args)?;
    let session = client.session()?;
    let mutex = session.mutex(format!("{}/multi/single", args.prefix))?;
    let names = |n: usize| (0..n).map(move |i| format!("{}/multi/{n}-{i}", args.prefix));
    let two = session.multi_lock(names(2))?;
    let four = session.multi_lock(names(4))?;

    let single_once = || -> Res<(Duration, Duration)> {
        let t0 = Instant::now();
        let guard = mutex.lock_timeout(WAIT)?;
        let t1 = Instant::now();
        guard.release()?;
        Ok((t1 - t0, t1.elapsed()))
    };
    let multi_once = |lock: &MultiLock| -> Res<(Duration, Duration)> {
        let t0 = Instant::now();
        let guard = lock.lock_timeout(WAIT)?;
        let t1 = Instant::now();
        guard.release()?;
        Ok((t1 - t0, t1.elapsed()))
    };
    for _ in 0..100 {
        single_once()?;
        multi_once(&two)?;
        multi_once(&four)?;
    }
    // lock, unlock, both: for the single mutex, 2 names, 4 names.
    let mut samples: [[Vec<Duration>; 3]; 3] = Default::default();
    for i in 0..args.n {
        for k in 0..3 {
            // Rotate which goes first, so no figure always follows the same one.
            let which = (i + k) % 3;
            let (a, b) = match which {
                0 => single_once()?,
                1 => multi_once(&two)?,
                _ => multi_once(&four)?,
            };
            samples[which][0].push(a);
            samples[which][1].push(b);
            samples[which][2].push(a + b);
        }
    }
    let mut medians = Vec::new();
    for (which, label) in ["multi_single", "multi_2", "multi_4"].iter().enumerate() {
        report(&format!("{label}_lock"), &samples[which][0], "");
        report(&format!("{label}_unlock"), &samples[which][1], "");
        let both = report(&format!("{label}_lock_unlock"), &samples[which][2], "");
        let row = match which {
            0 => "lock + unlock: one Mutex (beside multi-locks)",
            1 => "lock + unlock: MultiLock of 2 names",
            _ => "lock + unlock: MultiLock of 4 names",
        };
        summary.latency(row, both);
        medians.push(both.map(|s| s.median));
    }
    if let [Some(one), Some(two), Some(four)] = medians[..] {
        println!(
            "RESULT rust multi_over_single two_median_ratio={:.2} four_median_ratio={:.2}",
            two / one,
            four / one
        );
        summary.text(format!(
            "MultiLock / Mutex at the median: {:.2}x for 2 names, {:.2}x for 4",
            two / one,
            four / one
        ));
    }
    session.close()?;
    contended(args, summary)
}

/// Two contenders, each with its own client and session, for `SECS` seconds each row: one
/// mutex, then 2 and 4 names given in opposite orders (the multi-lock takes them in one).
fn contended(args: &Args, summary: &mut Summary) -> Res<()> {
    const SECS: u64 = 3;
    let mut rates = Vec::new();
    for names in [1usize, 2, 4] {
        let prefix = format!("{}/multi-contended/{names}", args.prefix);
        let mut threads = Vec::new();
        for contender in 0..2 {
            let client = connect(args)?;
            let prefix = prefix.clone();
            threads.push(std::thread::spawn(move || -> Res<u64> {
                let session = client.session()?;
                let mut list: Vec<String> = (0..names).map(|i| format!("{prefix}-{i}")).collect();
                if contender == 1 {
                    list.reverse();
                }
                let single = session.mutex(&list[0])?;
                let multi = session.multi_lock(&list)?;
                let until = Instant::now() + Duration::from_secs(SECS);
                let mut count = 0;
                while Instant::now() < until {
                    if names == 1 {
                        single.lock_timeout(WAIT)?.release()?;
                    } else {
                        multi.lock_timeout(WAIT)?.release()?;
                    }
                    count += 1;
                }
                session.close()?;
                Ok(count)
            }));
        }
        let mut total = 0;
        for t in threads {
            total += t.join().map_err(|_| "a contender panicked")??;
        }
        let rate = total as f64 / SECS as f64;
        println!(
            "RESULT rust multi_contended names={names} contenders=2 acquisitions_per_s={rate:.0}"
        );
        rates.push(rate);
    }
    summary.text(format!(
        "2 contenders, opposite orders: {:.0} acquisitions/s on one Mutex, {:.0} with 2 names, {:.0} with 4",
        rates[0], rates[1], rates[2]
    ));
    Ok(())
}
