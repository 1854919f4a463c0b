//! SIGINT, SIGTERM and SIGHUP: `signal_hook::flag` sets an atomic flag per signal, and the
//! main thread polls the flags between short waits (no self-pipe needed at a 25 ms tick).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

/// The signals that stop `etcd-sync` cleanly (release, then exit), each with its flag: set
/// when it arrived and was not taken yet. In increasing signal number, so that [`take`]
/// returns the lowest-numbered pending one.
static PENDING: [(libc::c_int, AtomicBool); 3] = [
    (libc::SIGHUP, AtomicBool::new(false)),
    (libc::SIGINT, AtomicBool::new(false)),
    (libc::SIGTERM, AtomicBool::new(false)),
];

/// Installs the handlers. SIGINT and SIGTERM are always handled, even when inherited as
/// ignored (a non-interactive shell ignores SIGINT for `cmd &`): `kill -INT` must still
/// release the lock and stop, as it stops `etcdctl lock`. SIGHUP stays ignored if it was
/// (`nohup` asks for exactly that).
/// SIGCHLD is reset to its default so that a parent that ignored it cannot make the
/// kernel reap CMD before we read its exit status.
pub fn install() -> io::Result<()> {
    reset_sigchld()?;
    for (signo, flag) in &PENDING {
        if *signo == libc::SIGHUP && ignored(*signo)? {
            continue;
        }
        // signal-hook installs its handler with SA_RESTART, whatever the inherited
        // disposition was (an ignored one is not chained to).
        signal_hook::flag::register(*signo, flag)?;
    }
    Ok(())
}

/// Whether `signo` was inherited as ignored. signal-hook registers handlers only; it does
/// not tell the disposition it replaces.
fn ignored(signo: libc::c_int) -> io::Result<bool> {
    // SAFETY: sigaction with a null new action only reads the current one into a
    // zero-initialised (valid) struct.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signo, std::ptr::null(), &mut current) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(current.sa_sigaction == libc::SIG_IGN)
    }
}

/// Sets SIGCHLD to its default disposition. signal-hook has no "back to default": it
/// installs handlers, and a handler here would interrupt system calls for nothing.
fn reset_sigchld() -> io::Result<()> {
    // SAFETY: setting a standard disposition (no handler) for a valid signal.
    if unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) } == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Takes one pending signal (the lowest-numbered), if any arrived since the last call.
pub fn take() -> Option<libc::c_int> {
    PENDING
        .iter()
        .find(|(_, flag)| flag.swap(false, Ordering::SeqCst))
        .map(|(signo, _)| *signo)
}

/// The name of a signal for messages (`SIGINT`), or its number.
pub fn name(signo: libc::c_int) -> String {
    match signo {
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGINT => "SIGINT".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGTERM => "SIGTERM".into(),
        other => format!("signal {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handled_in_signal_order() {
        let numbers: Vec<libc::c_int> = PENDING.iter().map(|(signo, _)| *signo).collect();
        assert!(numbers.is_sorted(), "{numbers:?}");
    }

    #[test]
    fn takes_lowest_first_and_once() {
        install().expect("install handlers");
        assert_eq!(take(), None);
        // SAFETY: raise to our own process; the handlers only set flags.
        unsafe {
            libc::raise(libc::SIGTERM);
            libc::raise(libc::SIGINT);
        }
        assert_eq!(take(), Some(libc::SIGINT));
        assert_eq!(take(), Some(libc::SIGTERM));
        assert_eq!(take(), None);
    }
}
