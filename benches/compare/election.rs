//! (c): election campaign + resign, uncontended.

use std::time::Instant;

use crate::args::Args;
use crate::stats::{Summary, report};
use crate::{Res, WAIT, connect, cpu};

pub fn election(args: &Args, summary: &mut Summary) -> Res<()> {
    let client = connect(args)?;
    let session = client.session()?;
    let election = session.election(format!("{}/election", args.prefix))?;
    for _ in 0..50 {
        election.campaign_timeout("me", WAIT)?.resign()?;
    }
    let (mut camp, mut res, mut both) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.campaigns {
        let t0 = Instant::now();
        let mut leadership = election.campaign_timeout("me", WAIT)?;
        let t1 = Instant::now();
        leadership.resign()?;
        let t2 = Instant::now();
        camp.push(t1 - t0);
        res.push(t2 - t1);
        both.push(t2 - t0);
    }
    let cpu = cpu::per_op("campaign_resign", args.campaigns, || {
        election.campaign_timeout("me", WAIT)?.resign()?;
        Ok(())
    })?;
    summary.text(format!(
        "client CPU per campaign + resign (user + system, getrusage): {cpu:.0} µs"
    ));
    let c = report("campaign", &camp, "");
    report("resign", &res, "");
    let cr = report("campaign_resign", &both, "");
    summary.latency("campaign (uncontended)", c);
    summary.latency("campaign + resign", cr);
    session.close()?;
    Ok(())
}
