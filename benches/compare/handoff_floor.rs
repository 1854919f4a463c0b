//! The handoff floor: the physical limit of a lock handoff, with no lock logic. It is the
//! holder's release Txn plus the time from that delete to a raw watcher's event.
//!
//! Thread B blocks on a raw watch of key K (`etcd_sync::testing::RawWatch`, deletes only, on
//! its own client). Each round, thread A puts K (not timed) and waits until B is about to
//! block. A then sleeps 1 ms, so that B is parked as a queued waiter would be. A takes
//! `t0` and deletes K with a plain `Client::txn`, shaped like our release (one compare on
//! K's create revision, one delete). B takes `t1` when its blocking `next_delete` returns
//! the event and hands `t1` back; the sample is `t1 - t0`. A lock handoff adds the waiter's
//! read after the event, and the lock's own work, to this.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use etcd_sync::testing::RawWatch;
use etcd_sync::{Compare, CompareOp, Txn, TxnOp};

use crate::args::Args;
use crate::stats::{Stats, Summary, report, tail};
use crate::{Res, WAIT, connect, join_bounded};

/// Rounds run before measuring (connections, HTTP/2 windows, etcd's caches).
const WARMUP: usize = 20;

/// How long A waits after B said it is about to block, so that B is parked.
const PARK: Duration = Duration::from_millis(1);

/// What B sends back for each delete: when `next_delete` returned, and the revision.
type Woke = Result<(Instant, i64), String>;

pub fn floor(args: &Args, summary: &mut Summary) -> Res<()> {
    let key = format!("{}/handoff-floor", args.prefix);
    // Two clients, as in the contended run: the release and the event travel on
    // different connections.
    let releaser = connect(args)?;
    let watcher = connect(args)?;
    let watch = RawWatch::deletes(&watcher, &key)?;
    let rounds = WARMUP + args.floor_n;

    let (ready_tx, ready) = mpsc::channel::<()>();
    let (woke_tx, woke) = mpsc::channel::<Woke>();
    let b = thread::spawn(move || {
        for _ in 0..rounds {
            if ready_tx.send(()).is_err() {
                return;
            }
            let result = match watch.next_delete(WAIT) {
                Ok(Some(revision)) => Ok((Instant::now(), revision)),
                Ok(None) => Err(format!("no delete event within {WAIT:?}")),
                Err(e) => Err(format!("raw watch: {e}")),
            };
            let failed = result.is_err();
            if woke_tx.send(result).is_err() || failed {
                return;
            }
        }
    });

    let mut samples = Vec::with_capacity(args.floor_n);
    let mut txns = Vec::with_capacity(args.floor_n);
    let mut event_first = 0usize;
    let result = (|| -> Res<()> {
        for round in 0..rounds {
            let created = releaser.put(&key, "")?;
            ready.recv_timeout(WAIT)?;
            thread::sleep(PARK);
            let t0 = Instant::now();
            let deleted = releaser.txn(
                Txn::new()
                    .when([Compare::create_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        created,
                    )])
                    .and_then([TxnOp::delete(key.as_str())]),
            )?;
            let answered = Instant::now();
            let (t1, revision) = woke.recv_timeout(WAIT)??;
            if !deleted.succeeded {
                return Err("the floor's release Txn did not take its success branch".into());
            }
            if revision != deleted.revision {
                return Err(format!(
                    "the raw watcher reported revision {revision}, the delete was {}",
                    deleted.revision
                )
                .into());
            }
            if round >= WARMUP {
                samples.push(t1.saturating_duration_since(t0));
                txns.push(answered - t0);
                if t1 < answered {
                    event_first += 1;
                }
            }
        }
        Ok(())
    })();
    // On an error B may still wait for an event: it gives up after WAIT.
    drop((ready, woke));
    join_bounded(vec![b], Instant::now() + WAIT + Duration::from_secs(1));
    result?;

    let st = report(
        "handoff_floor",
        &samples,
        &format!("event_before_txn_answer={event_first} {}", tail(&samples)),
    );
    let txn = report("handoff_floor_txn", &txns, "");
    summary.keep("handoff_floor", st);
    summary.latency("handoff floor (release Txn start -> raw event)", st);
    summary.latency("  of which the release Txn (answer to A)", txn);
    Ok(())
}

/// Prints `RESULT rust <figure> median_ratio=.. p90_ratio=..`: a handoff figure of this run
/// divided by the handoff floor measured earlier in the same run (nothing if either is
/// missing).
pub fn over_floor(figure: &str, handoff: Option<Stats>, extra: &str, summary: &mut Summary) {
    let (Some(h), Some(f)) = (handoff, summary.figure("handoff_floor")) else {
        return;
    };
    println!(
        "RESULT rust {figure} median_ratio={:.3} p90_ratio={:.3} handoff_median_us={:.0} \
         floor_median_us={:.0} {extra}",
        h.median / f.median,
        h.p90 / f.p90,
        h.median,
        f.median
    );
}
