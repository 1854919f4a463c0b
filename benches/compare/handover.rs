//! Issue 53: the gap when leadership changes hands, with one candidate waiting: a plain
//! `resign` against `hand_over` to that candidate, interleaved. Two clients, as two
//! processes would be. The gap is from the instant the old leader stops leading (a resign:
//! when it is called, its guard says "not leader" from then on; a hand-over: when it
//! returns, its guard says "leader" until the adoption is answered) until the successor's
//! `campaign` returns; "until it leads" is from the old leader's call.

use std::time::{Duration, Instant};

use crate::args::Args;
use crate::stats::{Summary, report};
use crate::{Res, WAIT, connect};

pub fn handover(args: &Args, summary: &mut Summary) -> Res<()> {
    let (leader_client, next_client) = (connect(args)?, connect(args)?);
    let (ours, theirs) = (leader_client.session()?, next_client.session()?);
    let name = format!("{}/handover", args.prefix);
    let election = ours.election(&name)?;
    let successor = theirs.election(&name)?;
    // One change of leader: `hand_over` or `resign`; (gap, until the successor leads).
    let once = |hand_over: bool| -> Res<(Duration, Duration)> {
        let mut leadership = election.campaign_timeout("old", WAIT)?;
        let next = successor.clone();
        let waiting = std::thread::spawn(move || {
            let leadership = next.campaign_timeout("new", WAIT);
            (Instant::now(), leadership)
        });
        while election.status()?.waiters.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let t0 = Instant::now();
        let stopped = if hand_over {
            leadership.hand_over("new")?;
            Instant::now()
        } else {
            leadership.resign()?;
            t0
        };
        let (led, new) = waiting.join().map_err(|_| "successor thread panicked")?;
        new?.resign()?;
        Ok((led.saturating_duration_since(stopped), led - t0))
    };
    for i in 0..20 {
        once(i % 2 == 0)?;
    }
    let n = args.campaigns.clamp(20, 200);
    let (mut resign_gap, mut resign_led, mut hand_gap, mut hand_led) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..2 * n {
        let (gap, led) = once(i % 2 == 1)?;
        if i % 2 == 1 {
            hand_gap.push(gap);
            hand_led.push(led);
        } else {
            resign_gap.push(gap);
            resign_led.push(led);
        }
    }
    let rg = report("resign_gap", &resign_gap, "");
    let rl = report("resign_until_next_leads", &resign_led, "");
    let hg = report("handover_gap", &hand_gap, "");
    let hl = report("handover_until_next_leads", &hand_led, "");
    summary.latency("no leader: resign → the next candidate leads", rg);
    summary.latency("no leader: hand_over returns → the successor leads", hg);
    summary.latency("resign called → the next candidate leads", rl);
    summary.latency("hand_over called → the successor leads", hl);
    if let (Some(rg), Some(hg)) = (rg, hg) {
        println!(
            "RESULT rust handover gap_over_resign_gap={:.2}",
            hg.median / rg.median.max(1.0)
        );
    }
    ours.close()?;
    theirs.close()?;
    Ok(())
}
