//! Issue 30: asking a holder to let go. Beside a mutex's lock + unlock in the same run,
//! interleaved: the time `Client::request_release` takes (one read of the line, one Txn),
//! and the time from the request's start until the holder's `release_requested()` channel
//! delivers it (the request's watch event on the holder's client).

use std::time::{Duration, Instant};

use crate::args::Args;
use crate::stats::{Summary, report};
use crate::{Res, WAIT, connect};

pub fn revoke(args: &Args, summary: &mut Summary) -> Res<()> {
    let holder_client = connect(args)?;
    let asker = connect(args)?;
    let session = holder_client.session()?;
    let mutex = session.mutex(format!("{}/revoke/mutex", args.prefix))?;
    let name = format!("{}/revoke/held", args.prefix);
    let guard = session.mutex(&name)?.lock_timeout(WAIT)?;
    let asked = guard.release_requested();

    let mutex_once = || -> Res<Duration> {
        let t0 = Instant::now();
        mutex.lock_timeout(WAIT)?.release()?;
        Ok(t0.elapsed())
    };
    let request_once = || -> Res<(Duration, Duration)> {
        let t0 = Instant::now();
        let holders = asker.request_release(&name)?;
        let t1 = Instant::now();
        if holders.len() != 1 {
            return Err(format!("asked {} holders, not 1", holders.len()).into());
        }
        asked.recv_timeout(WAIT)?;
        Ok((t1 - t0, t0.elapsed()))
    };
    for _ in 0..50 {
        mutex_once()?;
        request_once()?;
    }
    let (mut lock_unlock, mut request, mut heard) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..args.n {
        // Alternate which goes first, so neither always follows the other.
        if i % 2 == 0 {
            lock_unlock.push(mutex_once()?);
        }
        let (r, h) = request_once()?;
        request.push(r);
        heard.push(h);
        if i % 2 == 1 {
            lock_unlock.push(mutex_once()?);
        }
    }
    let base = report("revoke_mutex_lock_unlock", &lock_unlock, "");
    let call = report("revoke_request", &request, "");
    let told = report("revoke_heard", &heard, "");
    summary.latency("lock + unlock: one Mutex (beside release requests)", base);
    summary.latency("request_release (1 holder): read + Txn", call);
    summary.latency("request until the holder's channel delivers it", told);
    if let (Some(base), Some(call), Some(told)) = (base, call, told) {
        println!(
            "RESULT rust revoke request_over_mutex={:.2} heard_over_mutex={:.2}",
            call.median / base.median,
            told.median / base.median
        );
        summary.text(format!(
            "release request / Mutex lock+unlock at the median: {:.2}x to ask, {:.2}x until heard",
            call.median / base.median,
            told.median / base.median
        ));
    }
    drop(guard);
    session.close()?;
    Ok(())
}
