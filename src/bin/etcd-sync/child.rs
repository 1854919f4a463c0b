//! Running CMD while a lock or leadership is held.
//!
//! CMD runs in a process group of its own, so stopping it (on loss, or on a signal to
//! `etcd-sync`) reaches everything it started (`sh -c 'a & b'`), not just its first
//! process. When `etcd-sync` runs in the foreground of a terminal, that terminal is handed
//! to CMD's group while it runs (as a shell does for a job), so interactive commands can
//! read it and Ctrl-C / Ctrl-Z reach CMD; it is taken back afterwards.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// A terminal we are in the foreground of.
#[derive(Debug, Clone, Copy)]
struct Terminal {
    fd: libc::c_int,
    /// Our own process group, the terminal's foreground group before CMD started.
    pgrp: libc::pid_t,
}

/// CMD, started by [`Child::spawn`]. Reaped with `waitpid` here (not through
/// `std::process::Child`), so that stops are seen too.
#[derive(Debug)]
pub struct Child {
    /// CMD's pid, which is also its process group id.
    pid: libc::pid_t,
    terminal: Option<Terminal>,
    /// Exit code once reaped: the exit status, or 128 + the signal that killed it.
    code: Option<i32>,
}

impl Child {
    /// Starts `argv` with `env` added to our environment (replacing variables of the same
    /// name), stdin/stdout/stderr inherited, in a new process group.
    pub fn spawn(argv: &[OsString], env: &[(&str, String)]) -> io::Result<Child> {
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command given"))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(env.iter().map(|(name, value)| (name, value)))
            .process_group(0);
        let terminal = foreground_terminal();
        if let Some(terminal) = terminal {
            let fd = terminal.fd;
            // SAFETY: between fork and exec the closure only makes async-signal-safe calls
            // (getpid, pthread_sigmask, tcsetpgrp) and allocates nothing. Doing it in the
            // child, before exec, means CMD owns the terminal before it can read from it.
            unsafe {
                command.pre_exec(move || {
                    give_terminal(fd, libc::getpid());
                    Ok(())
                });
            }
        }
        let spawned = command.spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                if let Some(terminal) = terminal {
                    give_terminal(terminal.fd, terminal.pgrp);
                }
                return Err(e);
            }
        };
        let pid = libc::pid_t::try_from(child.id())
            .map_err(|_| io::Error::other("child pid out of range"))?;
        // `std::process::Child` neither kills nor waits on drop; we reap with waitpid.
        drop(child);
        Ok(Child {
            pid,
            terminal,
            code: None,
        })
    }

    /// CMD's exit code if it has ended (`Ok(None)` while it runs). Never blocks.
    ///
    /// When CMD is stopped (Ctrl-Z) while it owns our terminal, we take the terminal back
    /// and stop ourselves, so the shell sees the job as stopped; when the shell continues
    /// us, CMD gets the terminal back (if we have it) and is continued.
    pub fn poll(&mut self) -> io::Result<Option<i32>> {
        if self.code.is_some() {
            return Ok(self.code);
        }
        loop {
            let mut status: libc::c_int = 0;
            // SAFETY: waitpid on our own child with a valid status pointer.
            let reaped =
                unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG | libc::WUNTRACED) };
            if reaped == 0 {
                return Ok(None);
            }
            if reaped < 0 {
                let error = io::Error::last_os_error();
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(error);
            }
            if libc::WIFEXITED(status) {
                self.code = Some(libc::WEXITSTATUS(status));
            } else if libc::WIFSIGNALED(status) {
                self.code = Some(128 + libc::WTERMSIG(status));
            } else if libc::WIFSTOPPED(status) {
                self.stopped();
            }
            return Ok(self.code);
        }
    }

    fn stopped(&mut self) {
        let Some(terminal) = self.terminal else {
            return; // not a job-control stop we can pass on: leave it to whoever stopped it
        };
        give_terminal(terminal.fd, terminal.pgrp);
        // SAFETY: raise/tcgetpgrp/kill with valid arguments. SIGTSTP (not SIGSTOP) so that
        // an orphaned process group, which has nobody to continue it, ignores it.
        unsafe {
            libc::raise(libc::SIGTSTP);
            // Continued: by `fg` (we are in the foreground again) or by `bg`.
            if libc::tcgetpgrp(terminal.fd) == terminal.pgrp {
                give_terminal(terminal.fd, self.pid);
            }
            libc::kill(-self.pid, libc::SIGCONT);
        }
    }

    /// Whether any process of CMD's group still exists (CMD itself, until reaped, or
    /// anything it started that stayed in its group).
    pub fn group_alive(&self) -> bool {
        // SAFETY: signal 0 only checks for existence.
        unsafe { libc::kill(-self.pid, 0) == 0 }
    }

    /// Sends `signo` to CMD's whole process group, followed by SIGCONT so that stopped
    /// processes act on it.
    pub fn signal_group(&self, signo: libc::c_int) {
        // SAFETY: kill with a negative pid addresses CMD's process group, which exists at
        // least as long as CMD is unreaped (a zombie keeps its group).
        unsafe {
            libc::kill(-self.pid, signo);
            if signo != libc::SIGKILL && signo != libc::SIGCONT {
                libc::kill(-self.pid, libc::SIGCONT);
            }
        }
    }

    /// Takes the terminal back, if it was handed to CMD.
    pub fn restore_terminal(&mut self) {
        if let Some(terminal) = self.terminal.take() {
            give_terminal(terminal.fd, terminal.pgrp);
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.restore_terminal();
    }
}

/// The first of stdin, stdout, stderr that is a terminal whose foreground process group is
/// ours (`etcd-sync` runs in the foreground), if any.
fn foreground_terminal() -> Option<Terminal> {
    // SAFETY: getpgrp/isatty/tcgetpgrp only read process and terminal state.
    unsafe {
        let pgrp = libc::getpgrp();
        (0..3)
            .find(|&fd| libc::isatty(fd) == 1 && libc::tcgetpgrp(fd) == pgrp)
            .map(|fd| Terminal { fd, pgrp })
    }
}

/// Makes `pgrp` the terminal's foreground process group. SIGTTOU is blocked meanwhile:
/// a background process (CMD right after fork, or us after CMD took the terminal) would
/// otherwise be stopped by it. Errors are ignored: this is best effort.
fn give_terminal(fd: libc::c_int, pgrp: libc::pid_t) {
    // SAFETY: signal-mask calls on valid sets and tcsetpgrp; async-signal-safe on Linux
    // (pthread_sigmask is the rt_sigprocmask system call), so usable after fork.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut previous);
        libc::tcsetpgrp(fd, pgrp);
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
    }
}
