//! Side-by-side comparison driver: measures etcd-sync against an etcd that is already running
//! (`scripts/bench-compare` starts one and runs this, then etcd's own Go `concurrency`
//! package from `benches/go/main.go`, against the same server).
//!
//! Run: `cargo bench --bench compare -- --endpoints http://127.0.0.1:2379`; with
//! `--serve-etcd` it starts the run's etcd instead ([`serve`]).
//!
//! Options are listed in [`args`] (unknown arguments, such as the `--bench` cargo passes,
//! are ignored). Every figure is printed as one machine-readable line,
//! `RESULT rust <figure> key=value ...`, latencies in microseconds, followed by a summary.
//!
//! Layout: [`args`] (options), [`stats`] (percentiles, output), [`metrics`] (etcd's
//! /metrics over HTTP), [`turns`] (exclusion checks shared by the contended phases), and
//! one module per phase: [`uncontended`] (a, d), [`election`] (c), [`cost`] (f),
//! [`handoff_floor`] (the handoff floor, measured before the handoff phases of the same
//! run), [`contended`] (b, and the slow-handoff diagnosis), [`scaling`] (e), [`shared`] (g),
//! [`herd`] (h), [`rows`] and [`readers`] (the contender-count rows of issue 28, with
//! [`fleet`] connecting up to 1,024 contenders), [`stm`] (software transactions per second,
//! without and with conflicts), [`multi`] (multi-locks of 2 and 4 names beside a mutex),
//! [`revoke`] (asking a holder to let go, beside a mutex), [`barriers`] (barrier, latch and
//! double-barrier wakes beside a mutex), [`downgrade`] (a write that goes on as a read,
//! beside a mutex and a plain write), [`permits`] (one and three permits at once, beside a
//! mutex), [`handover`] (the gap of a change of leader: resign against hand-over),
//! [`resources`] (threads, memory and the held-locks figures). The summary ends with the figures of issue #12.

mod args;
mod barriers;
mod contended;
mod cost;
mod cpu;
mod downgrade;
mod election;
mod fleet;
mod handoff_floor;
mod handover;
mod herd;
mod metrics;
mod multi;
mod permits;
mod readers;
mod resources;
mod revoke;
mod rows;
mod scaling;
mod serve;
mod shared;
mod stats;
mod stm;
mod turns;
mod uncontended;

use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use etcd_sync::Client;

use args::Args;
use stats::Summary;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

/// Upper bound for every single lock, campaign or hand-over wait in this driver.
const WAIT: Duration = Duration::from_secs(30);

/// A new client of the endpoints (each phase connects on its own; contended workers, one each).
fn connect(args: &Args) -> Res<Client> {
    Ok(Client::connect(&args.endpoints)?)
}

/// Joins `handles`, waiting at most until `deadline`; returns the number left running.
fn join_bounded(handles: Vec<JoinHandle<()>>, deadline: Instant) -> usize {
    let mut left = handles;
    while !left.is_empty() && Instant::now() < deadline {
        let (done, running): (Vec<_>, Vec<_>) = left.into_iter().partition(|h| h.is_finished());
        for h in done {
            let _ = h.join();
        }
        left = running;
        if !left.is_empty() {
            thread::sleep(Duration::from_millis(5));
        }
    }
    left.len()
}

/// Joins one thread that returns a value, waiting at most until `deadline`.
fn join_bounded_value<T>(handle: JoinHandle<T>, deadline: Instant) -> Option<T> {
    while !handle.is_finished() {
        if Instant::now() > deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(5));
    }
    handle.join().ok()
}

/// The heading of the closing block (a child process's block is read back under it).
pub const TARGETS_HEADER: &str = "etcd-sync issue #12 figures (this run):";

/// The closing block: the figures issue #12 sets targets for, from whatever phases ran.
/// A child process (the held-locks phase) passes its lines up as they are.
fn issue_12(args: &Args, summary: &Summary) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(t) = summary.value("contended_throughput") {
        out.push(format!(
            "contended throughput: {t:.0} acq/s with {} contenders (÷ Go: in \
             scripts/bench-compare's table)",
            args.contenders
        ));
    }
    if let Some(f) = summary.figure("handoff_floor") {
        let mut parts = Vec::new();
        if let Some(h) = summary.figure("handoff") {
            parts.push(format!(
                "{} contenders {:.0} µs = {:.2}x",
                args.contenders,
                h.median,
                h.median / f.median
            ));
        }
        for &w in &args.waiters {
            if let Some(h) = summary.figure(&format!("handoff_waiters_{w}")) {
                parts.push(format!(
                    "{w} waiters {:.0} µs = {:.2}x",
                    h.median,
                    h.median / f.median
                ));
            }
        }
        out.push(format!(
            "handoff median ÷ handoff floor ({:.0} µs): {}",
            f.median,
            if parts.is_empty() {
                "no handoff phase ran".to_string()
            } else {
                parts.join(", ")
            }
        ));
    }
    if let Some((from, to, ratio)) = scaling::growth_ratio(args, summary) {
        out.push(format!(
            "handoff median, {to} waiters ÷ {from} waiters: {ratio:.2}x"
        ));
    }
    if let (Some(r), Some(w)) = (
        summary.value("contended_range"),
        summary.value("contended_watch_streams"),
    ) {
        out.push(format!(
            "per contended acquisition (etcd's counters): {r:.2} Range, {w:.2} watch streams \
             opened"
        ));
    }
    out.extend(summary.targets.iter().cloned());
    out
}

// ---------------------------------------------------------------------------------------

fn main() {
    if std::env::args().any(|a| a == "--serve-etcd") {
        if let Err(e) = serve::serve() {
            eprintln!("compare: --serve-etcd: {e}");
            std::process::exit(1);
        }
        return;
    }
    let args = match Args::parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("compare: {e}");
            std::process::exit(2);
        }
    };
    if args.endpoints.is_empty() {
        // `cargo bench` without `--bench compare` runs this too: nothing to measure against.
        println!(
            "compare: no --endpoints given (or $ETCD_ENDPOINTS); skipping. \
             Run scripts/bench-compare, or: cargo bench --bench compare -- --endpoints URL"
        );
        return;
    }
    // Watchdog: never hang, whatever happens below.
    let timeout = args.timeout;
    thread::spawn(move || {
        thread::sleep(timeout);
        eprintln!("compare: aborted after {timeout:?} (watchdog)");
        std::process::exit(3);
    });

    println!(
        "compare: etcd-sync against {} (n={}, contenders={}, total={}, campaigns={}, \
         waiters={:?}, rows={:?}, handoffs={}, sessions={})",
        args.endpoints.join(","),
        args.n,
        args.contenders,
        args.total,
        args.campaigns,
        args.waiters,
        args.rows,
        args.handoffs,
        args.sessions
    );
    let mut summary = Summary::default();
    let mut failed = Vec::new();
    let mut run = |phase: &str, wanted: bool, f: &dyn Fn(&Args, &mut Summary) -> Res<()>| {
        if !wanted {
            return;
        }
        let t = Instant::now();
        eprintln!("compare: {phase} ...");
        if let Err(e) = f(&args, &mut summary) {
            eprintln!("compare: {phase} failed: {e}");
            println!("RESULT rust {phase} error={:?}", e.to_string());
            failed.push(phase.to_string());
        }
        eprintln!("compare: {phase} took {:.1} s", t.elapsed().as_secs_f64());
    };
    let wants = |phase: &str| args.wants(phase);
    let named = |phase: &str| args.only.iter().flatten().any(|p| p == phase);
    run(
        "uncontended",
        wants("uncontended"),
        &uncontended::uncontended,
    );
    run("multi", wants("multi"), &multi::multi);
    run("revoke", wants("revoke"), &revoke::revoke);
    run("downgrade", wants("downgrade"), &downgrade::downgrade);
    run("permits", wants("permits"), &permits::permits);
    run("barriers", wants("barriers"), &barriers::barriers);
    run("election", wants("election"), &election::election);
    run("handover", wants("handover"), &handover::handover);
    run("cost", wants("cost"), &cost::cost);
    // Right before the handoffs it is the floor of, in the same process.
    let floor = wants("floor") || wants("contended") || wants("scaling");
    run("floor", floor, &handoff_floor::floor);
    run("contended", wants("contended"), &contended::contended);
    run(
        "rows",
        (wants("contended") || named("rows")) && !args.rows.is_empty(),
        &rows::rows,
    );
    run("scaling", wants("scaling"), &|args, summary| {
        for &w in &args.waiters {
            scaling::scaling_one(args, w, summary)?;
        }
        scaling::growth(args, summary);
        Ok(())
    });
    run("diagnose", wants("diagnose"), &contended::diagnose);
    run("shared", wants("shared"), &shared::shared);
    run("herd", wants("herd"), &herd::herd);
    run("stm", wants("stm"), &stm::stm);
    run(
        "resources",
        wants("resources"),
        &resources::resources_in_child,
    );
    run(
        "held",
        wants("held") && !wants("resources"),
        &resources::held_in_child,
    );
    run(
        "resources-here",
        named("resources-here"),
        &resources::resources,
    );
    run("held-here", named("held-here"), &resources::held);

    println!();
    println!("etcd-sync summary ({}):", args.endpoints.join(","));
    for line in &summary.lines {
        println!("{line}");
    }
    let targets = issue_12(&args, &summary);
    if !targets.is_empty() {
        println!();
        println!("{TARGETS_HEADER}");
        for line in targets {
            println!("  {line}");
        }
    }
    if !failed.is_empty() {
        eprintln!("compare: failed phases: {}", failed.join(", "));
        std::process::exit(1);
    }
}
