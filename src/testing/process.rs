//! Operating-system primitives for the etcd child processes: the parent-death signal,
//! sending signals, and waiting until a stopped process really is stopped.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Spawns `command` with the Linux parent-death signal set to `SIGKILL`, so that etcd does
/// not outlive a test process that dies without unwinding (abort, a signal).
pub(super) fn spawn_dying_with_parent(command: &mut Command) -> io::Result<Child> {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe operations are allowed. It only makes the prctl(2) and
    // getppid(2) system calls and builds `io::Error`s from raw OS error codes, which do
    // not allocate; it touches no lock and no shared state of the parent.
    unsafe {
        command.pre_exec(move || die_with_parent(parent));
    }
    command.spawn()
}

/// Runs in the forked child before exec: asks the kernel to `SIGKILL` etcd when the thread
/// that spawned it exits. Only async-signal-safe, non-allocating calls.
fn die_with_parent(parent: u32) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        // SAFETY: prctl(2) with PR_SET_PDEATHSIG takes a signal number and only changes an
        // attribute of the calling process; no pointers are involved.
        if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // If the parent died between fork and prctl, the death signal will never come.
        // SAFETY: getppid(2) has no preconditions.
        if unsafe { libc::getppid() } as u32 != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = parent;
    Ok(())
}

/// Sends `signal` to a child that the caller has not reaped yet.
pub(super) fn send_signal(child: &Child, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(child.id())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "process id out of range"))?;
    // SAFETY: kill(2) has no memory-safety preconditions. `pid` is our own child, not yet
    // reaped (callers hold the `Child`), so it cannot name a recycled, unrelated process.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Waits (up to 1 s) until every thread of `pid` is in the stopped state (`T`): `SIGSTOP`
/// is asynchronous, and a thread busy in the kernel may still finish writing a response.
pub(super) fn wait_all_threads_stopped(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        let all_stopped = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks.filter_map(|t| t.ok()).all(|task| {
                    std::fs::read_to_string(task.path().join("stat"))
                        .ok()
                        .and_then(|stat| {
                            // The state follows the ")" that closes the command name.
                            stat.rsplit_once(')')
                                .map(|(_, rest)| rest.trim_start().starts_with('T'))
                        })
                        .unwrap_or(true)
                })
            })
            .unwrap_or(true);
        if all_stopped {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
