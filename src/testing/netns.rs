//! A private network namespace for one test: the test binary runs that test again inside
//! one (`unshare -n`), where the firewall may be changed without touching the machine's.
//! Every `nft` command goes through [`nft`], which refuses to run outside such a namespace.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::error::context;
use super::process::spawn_dying_with_parent;

/// Set in the re-run test: the network namespace of the process that started it (as
/// `/proc/self/ns/net` names it), which the re-run test must not be in.
pub(super) const NETNS_VAR: &str = "ETCD_SYNC_IN_NETNS";

/// Printed by the re-run test once it is inside its namespace: the parent's proof that the
/// test ran there (a misspelled test name would run nothing and pass).
const ENTERED: &str = "etcd-sync: running inside a private network namespace";

/// How often the parent looks whether the re-run test has ended.
const POLL: Duration = Duration::from_millis(50);

/// What to install, for the error messages.
const INSTALL: &str = "needs root, `unshare` (util-linux), `ip` (iproute2) and `nft` \
                       (apt-get install nftables; scripts/test installs it)";

/// The network namespace this process is in, such as `net:[4026531833]`.
fn current_netns() -> io::Result<OsString> {
    std::fs::read_link("/proc/self/ns/net")
        .map(PathBuf::into_os_string)
        .map_err(|e| context(e, "cannot read /proc/self/ns/net"))
}

/// `tool` on `PATH` or in the system directories (`PATH` may leave out `sbin`).
pub(super) fn find_tool(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|candidate| candidate.is_file())
}

/// `tool`'s path, or an error saying what is missing and what to install.
fn require_tool(tool: &str) -> io::Result<PathBuf> {
    find_tool(tool).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("`{tool}` not found: a partition test {INSTALL}"),
        )
    })
}

/// Whether this process is the re-run test, inside its namespace.
pub(super) fn inside() -> bool {
    std::env::var_os(NETNS_VAR).is_some()
}

/// `Ok` only in a network namespace other than the one the test was started in (and, when
/// readable, other than init's): the guard before every firewall change.
pub(super) fn check_private() -> io::Result<()> {
    let refuse = |why: &str| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("refusing to change the firewall: {why}"),
        ))
    };
    let Some(parent) = std::env::var_os(NETNS_VAR) else {
        return refuse("this process is not a test re-run in a private network namespace");
    };
    let here = current_netns()?;
    if here == parent {
        return refuse("this process is still in the network namespace it was started in");
    }
    if let Ok(init) = std::fs::read_link("/proc/1/ns/net")
        && init.into_os_string() == here
    {
        return refuse("this process is in the network namespace of process 1");
    }
    Ok(())
}

/// Runs `nft -f -` with `script`, after [`check_private`].
pub(super) fn nft(script: &str) -> io::Result<()> {
    check_private()?;
    let binary = require_tool("nft")?;
    let mut child = Command::new(&binary)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| context(e, format_args!("cannot run {}", binary.display())))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    let output = child.wait_with_output()?;
    if output.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "nft failed ({}): {}\nscript:\n{script}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

/// Inside the namespace: checks it is private, brings up `lo`, and says so on stderr.
pub(super) fn set_up_inside() -> io::Result<()> {
    check_private()?;
    let ip = require_tool("ip")?;
    let status = Command::new(&ip)
        .args(["link", "set", "lo", "up"])
        .status()
        .map_err(|e| context(e, format_args!("cannot run {}", ip.display())))?;
    if !status.success() {
        return Err(io::Error::other(format!(
            "`ip link set lo up` failed: {status}"
        )));
    }
    eprintln!("{ENTERED}");
    Ok(())
}

/// Outside: runs test `test` of this test binary again in a new network namespace
/// (`unshare -n`), prints its output (through this test's stderr), and waits for it, for at
/// most `limit` (then kills it). `Ok` only if it ran inside the namespace and passed.
pub(super) fn rerun_inside(test: &str, limit: Duration) -> io::Result<()> {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("not running as root: a partition test {INSTALL}"),
        ));
    }
    let unshare = require_tool("unshare")?;
    require_tool("ip")?;
    require_tool("nft")?;
    let exe = std::env::current_exe().map_err(|e| context(e, "cannot find the test binary"))?;
    let mut command = Command::new(&unshare);
    command
        .args(["-n", "--"])
        .arg(&exe)
        .args([test, "--exact", "--nocapture", "--include-ignored"])
        .args(["--test-threads=1"])
        .env(NETNS_VAR, current_netns()?)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = spawn_dying_with_parent(&mut command)
        .map_err(|e| context(e, format_args!("cannot run {}", unshare.display())))?;
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|out| Box::new(out) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|err| Box::new(err) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|stream| thread::spawn(move || echo_lines(stream)))
    .collect();
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(POLL);
    };
    let mut entered = false;
    for reader in readers {
        entered |= reader.join().unwrap_or(false);
    }
    let test_binary = exe.file_name().map_or(exe.as_path(), Path::new).display();
    match status {
        None => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{test_binary} {test} did not end within {limit:?} in its namespace: killed"),
        )),
        Some(status) if !status.success() => Err(io::Error::other(format!(
            "{test_binary} {test} failed in its network namespace ({status}): see its output above"
        ))),
        Some(_) if !entered => Err(io::Error::other(format!(
            "{test_binary} {test} did not run in its network namespace: is `{test}` the test's \
             exact name?"
        ))),
        Some(_) => Ok(()),
    }
}

/// Prints every line of `stream` on this thread's stderr (captured by the test harness
/// like the test's own); `true` if one was the [`ENTERED`] line.
fn echo_lines(stream: Box<dyn Read + Send>) -> bool {
    let mut entered = false;
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else {
            break;
        };
        entered |= line == ENTERED;
        eprintln!("  | {line}");
    }
    entered
}
