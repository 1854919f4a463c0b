//! (g): OS threads and resident memory, measured in a fresh child process: many sessions
//! ([`resources`]), then many locks held by one client and the acquire latency with them
//! held ([`held`]).

use std::io::Read;
use std::thread;
use std::time::{Duration, Instant};

use etcd_sync::Session;

use crate::args::Args;
use crate::metrics::watchers;
use crate::stats::{Summary, report};
use crate::{Res, TARGETS_HEADER, WAIT, connect};

/// Runs [`resources`], then [`held`], each in a fresh child process (this executable,
/// `--only resources-here` / `held-here`): earlier phases leave the allocator's heap grown,
/// which would hide the memory that new sessions and locks take.
pub fn resources_in_child(args: &Args, summary: &mut Summary) -> Res<()> {
    in_child(
        args,
        "resources-here",
        &["--sessions".into(), args.sessions.to_string()],
        "resources",
        summary,
    )?;
    held_in_child(args, summary)
}

/// Runs [`held`] in a fresh child process.
pub fn held_in_child(args: &Args, summary: &mut Summary) -> Res<()> {
    in_child(
        args,
        "held-here",
        &[
            "--held".into(),
            args.held.to_string(),
            "--held-sessions".into(),
            args.held_sessions.to_string(),
        ],
        "held",
        summary,
    )
}

/// Runs this executable with `--only <phase>` and `extra` arguments, passes its `RESULT`
/// lines on, and adds its summary (and issue #12 lines) to `summary`.
fn in_child(
    args: &Args,
    phase: &str,
    extra: &[String],
    prefix: &str,
    summary: &mut Summary,
) -> Res<()> {
    let exe = std::env::current_exe()?;
    let mut child = std::process::Command::new(exe)
        .args([
            "--only",
            phase,
            "--endpoints",
            &args.endpoints.join(","),
            "--prefix",
            &format!("{}/{prefix}", args.prefix),
            "--timeout-secs",
            "600",
        ])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut stdout = child.stdout.take().ok_or("no stdout from child")?;
    let reader = thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let deadline = Instant::now() + Duration::from_secs(620);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{phase} child did not finish in time").into());
        }
        thread::sleep(Duration::from_millis(20));
    };
    let out = reader.join().map_err(|_| "reader thread panicked")?;
    #[derive(PartialEq)]
    enum Part {
        Figures,
        Summary,
        Targets,
    }
    let mut part = Part::Figures;
    for line in out.lines() {
        if line.starts_with("RESULT ") {
            println!("{line}");
        } else if line.starts_with("etcd-sync summary") {
            part = Part::Summary;
        } else if line == TARGETS_HEADER {
            part = Part::Targets;
        } else if !line.trim().is_empty() {
            match part {
                Part::Figures => {}
                Part::Summary => summary.text(line.trim().to_string()),
                Part::Targets => summary.targets.push(line.trim().to_string()),
            }
        }
    }
    if !status.success() {
        return Err(format!("{phase} child exited with {status}").into());
    }
    Ok(())
}

pub fn resources(args: &Args, summary: &mut Summary) -> Res<()> {
    let threads_before = os_threads();
    let client = connect(args)?;
    let first = client.session()?;
    let threads_one = os_threads();
    let rss_one = vm_rss_kb();
    let mut sessions = vec![first];
    for _ in 1..args.sessions {
        sessions.push(client.session()?);
    }
    thread::sleep(Duration::from_millis(200));
    let threads_many = os_threads();
    let rss_many = vm_rss_kb();
    let mut guards = Vec::with_capacity(sessions.len());
    for (i, s) in sessions.iter().enumerate() {
        guards.push(
            s.mutex(format!("{}/held/{i}", args.prefix))?
                .lock_timeout(WAIT)?,
        );
    }
    thread::sleep(Duration::from_millis(200));
    let threads_locks = os_threads();
    let rss_locks = vm_rss_kb();
    drop(guards);
    for s in &sessions {
        let _ = s.close();
    }
    drop(sessions);
    drop(client);
    let threads_after = os_threads();
    let n = args.sessions;
    let per = |a: u64, b: u64| (a.saturating_sub(b) as f64 * 1024.0 / n as f64).round();
    println!(
        "RESULT rust threads before_client={threads_before} one_session={threads_one} \
         sessions_{n}={threads_many} locks_{n}={threads_locks} after_drop={threads_after}"
    );
    println!(
        "RESULT rust memory rss_one_session_kb={rss_one} sessions_{n}_delta_kb={} \
         per_session_bytes={} locks_{n}_delta_kb={} per_lock_bytes={}",
        rss_many.saturating_sub(rss_one),
        per(rss_many, rss_one),
        rss_locks.saturating_sub(rss_many),
        per(rss_locks, rss_many),
    );
    summary.text(format!(
        "OS threads: {threads_before} before the client, {threads_one} with 1 session, \
         {threads_many} with {n} sessions, {threads_locks} with {n} locks held"
    ));
    summary.text(format!(
        "RSS: +{} KiB for {n} sessions ({} B each), +{} KiB for {n} held locks ({} B each)",
        rss_many.saturating_sub(rss_one),
        per(rss_many, rss_one),
        rss_locks.saturating_sub(rss_many),
        per(rss_locks, rss_many),
    ));
    Ok(())
}

/// This process's OS threads (0 if /proc cannot be read).
fn os_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// This process's resident memory in KiB (0 if /proc cannot be read).
fn vm_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Latency probes per figure: lock + unlock of fresh names, the median reported.
const PROBES: usize = 50;

/// How long a guard waits before it follows its key (see docs/design/guards-follow.md), plus
/// margin:
/// the held locks are held at least this long before the probes with them held.
const FOLLOWING_AFTER: Duration = Duration::from_millis(300);

/// One client holds `--held` locks on distinct names (spread over `--held-sessions`
/// sessions): OS threads, resident memory per held lock, and the acquire latency of a
/// fresh lock with none held against one with all of them held (each the median of
/// [`PROBES`] lock + unlock rounds on the first session; a third set after releasing them
/// shows the drift).
pub fn held(args: &Args, summary: &mut Summary) -> Res<()> {
    let wall = Instant::now();
    let n = args.held;
    let endpoint = &args.endpoints[0];
    let threads_before = os_threads();
    let client = connect(args)?;
    let sessions = (0..args.held_sessions)
        .map(|_| client.session())
        .collect::<Result<Vec<_>, _>>()?;
    let probe_session = &sessions[0];
    // Warm-up: connection, HTTP/2 windows, allocator, etcd's caches.
    probes(probe_session, &format!("{}/warmup", args.prefix))?;
    let (first_acq, first_rel) = probes(probe_session, &format!("{}/first", args.prefix))?;

    let threads_idle = os_threads();
    let rss_idle = vm_rss_kb();
    let watchers_idle = watchers(endpoint).ok().flatten();
    let t = Instant::now();
    let mut guards = Vec::with_capacity(n);
    let mut fill = Vec::with_capacity(n);
    for i in 0..n {
        let session = &sessions[i % sessions.len()];
        let mutex = session.mutex(format!("{}/held/{i}", args.prefix))?;
        let t0 = Instant::now();
        guards.push(mutex.lock_timeout(WAIT)?);
        fill.push((t0 - t, t0.elapsed()));
    }
    let acquire_all = t.elapsed();
    // Every guard follows its key from 200 ms on: wait until etcd counts a watcher per
    // held lock (bounded), and at least FOLLOWING_AFTER.
    let t = Instant::now();
    thread::sleep(FOLLOWING_AFTER);
    let mut followed = None;
    if let Some(idle) = watchers_idle {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let now = watchers(endpoint).ok().flatten().map(|w| w - idle);
            followed = now.or(followed);
            if now.is_none_or(|w| w >= n as f64) || Instant::now() > until {
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
    let follow_wait = t.elapsed();
    let threads_held = os_threads();
    let rss_held = vm_rss_kb();
    let (held_acq, held_rel) = probes(probe_session, &format!("{}/at-{n}", args.prefix))?;
    let t = Instant::now();
    drop(guards);
    let release_all = t.elapsed();
    // Again with none held: the drift over the phase (a busy machine, etcd's growing
    // store), to tell it from the cost of the held locks.
    let (after_acq, _) = probes(probe_session, &format!("{}/after", args.prefix))?;
    for s in &sessions {
        let _ = s.close();
    }
    drop(sessions);
    drop(client);
    let threads_after = os_threads();
    let wall = wall.elapsed();

    let fmt_followed = followed.map_or("?".to_string(), |f| format!("{f:.0}"));
    println!(
        "RESULT rust held_locks held={n} sessions={} acquire_all_ms={} follow_wait_ms={} \
         watchers_at_etcd={fmt_followed} release_all_ms={} wall_ms={}",
        args.held_sessions,
        acquire_all.as_millis(),
        follow_wait.as_millis(),
        release_all.as_millis(),
        wall.as_millis()
    );
    println!(
        "RESULT rust held_threads before_client={threads_before} idle={threads_idle} \
         held_{n}={threads_held} after_drop={threads_after}"
    );
    let delta_kb = rss_held.saturating_sub(rss_idle);
    let per_lock = (delta_kb as f64 * 1024.0 / n as f64).round();
    println!(
        "RESULT rust held_memory rss_idle_kb={rss_idle} held_{n}_delta_kb={delta_kb} \
         per_held_lock_bytes={per_lock}"
    );
    // The acquires while filling up: the first tenth against the last. Only acquires from
    // FOLLOWING_AFTER on count as early: from then on, earlier guards' watchers are being
    // created alongside, as they are for the last tenth.
    let tenth = (n / 10).max(1);
    let steady: Vec<Duration> = fill
        .iter()
        .filter(|(at, _)| *at >= FOLLOWING_AFTER)
        .map(|(_, took)| *took)
        .collect();
    let early = report(
        "held_fill_first_tenth",
        &steady[..tenth.min(steady.len())],
        "",
    );
    let last: Vec<Duration> = fill[n - tenth..].iter().map(|(_, took)| *took).collect();
    let late = report("held_fill_last_tenth", &last, "");
    if let (Some(early), Some(late)) = (early, late) {
        println!(
            "RESULT rust held_fill median_ratio={:.3} first_tenth_median_us={:.0} \
             last_tenth_median_us={:.0} held={n}",
            late.median / early.median,
            early.median,
            late.median
        );
    }
    let first = report("acquire_first", &first_acq, "held=0");
    report("release_first", &first_rel, "held=0");
    let at = report(&format!("acquire_at_{n}"), &held_acq, &format!("held={n}"));
    report(&format!("release_at_{n}"), &held_rel, &format!("held={n}"));
    let after = report("acquire_after_release", &after_acq, "held=0");
    summary.text(format!(
        "{n} locks held by one client ({} session(s)): acquired in {:.1} s, followed by \
         {fmt_followed} watchers at etcd after {:.1} s, released in {:.1} s ({:.1} s in all)",
        args.held_sessions,
        acquire_all.as_secs_f64(),
        follow_wait.as_secs_f64(),
        release_all.as_secs_f64(),
        wall.as_secs_f64()
    ));
    if let (Some(early), Some(late)) = (early, late) {
        summary.text(format!(
            "while filling up: acquire median {:.0} µs for the first tenth (from {} ms on), \
             {:.0} µs for the last ({:.2}x)",
            early.median,
            FOLLOWING_AFTER.as_millis(),
            late.median,
            late.median / early.median
        ));
    }
    summary.text(format!(
        "OS threads: {threads_idle} idle, {threads_held} with {n} locks held; RSS +{delta_kb} \
         KiB for {n} held locks ({per_lock} B each)"
    ));
    summary.latency("acquire, no other lock held", first);
    summary.latency(&format!("acquire, {n} locks held"), at);
    summary.latency("acquire, none held again (after releasing them)", after);
    if let (Some(first), Some(at)) = (first, at) {
        let ratio = at.median / first.median;
        println!(
            "RESULT rust acquire_at_{n}_over_first ratio={ratio:.3} p90_ratio={:.3} held={n} \
             first_median_us={:.0} held_median_us={:.0} after_release_median_us={:.0}",
            at.p90 / first.p90,
            first.median,
            at.median,
            after.map_or(0.0, |a| a.median)
        );
        summary.targets.push(format!(
            "acquire median with {n} locks held ÷ with none: {:.0} µs ÷ {:.0} µs = {ratio:.2}x \
             (threads {threads_held}, {per_lock} B per held lock)",
            at.median, first.median
        ));
    }
    Ok(())
}

/// [`PROBES`] rounds of lock + unlock on fresh names under `prefix`: the lock and the
/// unlock latencies.
fn probes(session: &Session, prefix: &str) -> Res<(Vec<Duration>, Vec<Duration>)> {
    let (mut acquire, mut release) = (Vec::new(), Vec::new());
    for i in 0..PROBES {
        let mutex = session.mutex(format!("{prefix}/{i}"))?;
        let t0 = Instant::now();
        let guard = mutex.lock_timeout(WAIT)?;
        let t1 = Instant::now();
        guard.release()?;
        acquire.push(t1 - t0);
        release.push(t1.elapsed());
    }
    Ok((acquire, release))
}
