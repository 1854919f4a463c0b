//! (g): OS threads and resident memory, measured in a fresh child process.

use std::io::Read;
use std::thread;
use std::time::{Duration, Instant};

use crate::args::Args;
use crate::stats::Summary;
use crate::{Res, WAIT, connect};

/// Runs [`resources`] in a fresh child process (this executable, `--only resources-here`):
/// earlier phases leave the allocator's heap grown, which would hide the memory that new
/// sessions and locks take.
pub fn resources_in_child(args: &Args, summary: &mut Summary) -> Res<()> {
    let exe = std::env::current_exe()?;
    let mut child = std::process::Command::new(exe)
        .args([
            "--only",
            "resources-here",
            "--endpoints",
            &args.endpoints.join(","),
            "--sessions",
            &args.sessions.to_string(),
            "--prefix",
            &format!("{}/resources", args.prefix),
            "--timeout-secs",
            "600",
        ])
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
            return Err("resources child did not finish in time".into());
        }
        thread::sleep(Duration::from_millis(20));
    };
    let out = reader.join().map_err(|_| "reader thread panicked")?;
    let mut in_summary = false;
    for line in out.lines() {
        if line.starts_with("RESULT ") {
            println!("{line}");
        } else if line.starts_with("etcd-sync summary") {
            in_summary = true;
        } else if in_summary && !line.trim().is_empty() {
            summary.text(line.trim().to_string());
        }
    }
    if !status.success() {
        return Err(format!("resources child exited with {status}").into());
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
