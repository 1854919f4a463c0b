//! (f): etcd requests per operation, from etcd's gRPC counters around single operations.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::args::Args;
use crate::metrics::{Counters, counters};
use crate::stats::Summary;
use crate::{Res, WAIT, connect, join_bounded};

pub fn cost(args: &Args, summary: &mut Summary) -> Res<()> {
    let endpoint = args.endpoints[0].clone();
    let client = connect(args)?;
    let holder = client.session()?;
    let waiter = client.session()?;
    let name = format!("{}/cost", args.prefix);
    let mine = holder.mutex(&name)?;
    let theirs = waiter.mutex(&name)?;
    mine.lock_timeout(WAIT)?.release()?;
    theirs.lock_timeout(WAIT)?.release()?;

    const N: usize = 20;
    let (mut acquire, mut release) = (Counters::default(), Counters::default());
    for _ in 0..N {
        let s0 = counters(&endpoint)?;
        let guard = mine.lock_timeout(WAIT)?;
        let s1 = counters(&endpoint)?;
        guard.release()?;
        let s2 = counters(&endpoint)?;
        acquire.add(&s1.minus(&s0));
        release.add(&s2.minus(&s1));
    }

    // A queued waiter: what it costs to join the line and start watching, and what one
    // handoff costs (the holder's release plus the waiter's work after the delete event).
    const H: usize = 10;
    let (mut queue, mut handoff) = (Counters::default(), Counters::default());
    for _ in 0..H {
        let guard = mine.lock_timeout(WAIT)?;
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (got_tx, got_rx) = mpsc::channel::<Res<()>>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let theirs = theirs.clone();
        let t = thread::spawn(move || {
            if go_rx.recv_timeout(WAIT).is_err() {
                return;
            }
            match theirs.lock_timeout(WAIT) {
                Ok(g) => {
                    let _ = got_tx.send(Ok(()));
                    let _ = done_rx.recv_timeout(WAIT);
                    let _ = g.release();
                }
                Err(e) => {
                    let _ = got_tx.send(Err(e.into()));
                }
            }
        });
        let s0 = counters(&endpoint)?;
        go_tx.send(())?;
        // Long enough to be queued and watching: Txn + Watch created + Range take ~1 ms.
        thread::sleep(Duration::from_millis(300));
        let s1 = counters(&endpoint)?;
        guard.release()?;
        got_rx.recv_timeout(WAIT)??;
        let s2 = counters(&endpoint)?;
        let _ = done_tx.send(());
        join_bounded(vec![t], Instant::now() + WAIT);
        queue.add(&s1.minus(&s0));
        handoff.add(&s2.minus(&s1));
    }
    println!("RESULT rust cost_acquire {} n={N}", acquire.per_op(N));
    println!("RESULT rust cost_release {} n={N}", release.per_op(N));
    println!("RESULT rust cost_queue {} n={H}", queue.per_op(H));
    println!("RESULT rust cost_handoff {} n={H}", handoff.per_op(H));
    // After the watch event, excluding the holder's release (one Txn per handoff).
    let h = |m: &str| Counters::get(&handoff.handled, m) / H as f64;
    let r = |m: &str| Counters::get(&release.handled, m) / N as f64;
    let after = (
        h("Txn") - r("Txn"),
        h("Range") - r("Range"),
        h("DeleteRange") - r("DeleteRange"),
    );
    println!(
        "RESULT rust cost_after_event txn={:.2} range={:.2} delete_range={:.2} requests={:.2}",
        after.0,
        after.1,
        after.2,
        after.0 + after.1 + after.2
    );
    summary.text(format!(
        "requests: acquire {:.2}, release {:.2}, waiter after the delete event {:.2} \
         (joining the line: {})",
        acquire.handled_unary_total / N as f64,
        release.handled_unary_total / N as f64,
        after.0 + after.1 + after.2,
        queue.per_op(H)
    ));
    holder.close()?;
    waiter.close()?;
    Ok(())
}
