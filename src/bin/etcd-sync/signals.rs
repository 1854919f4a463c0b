//! SIGINT, SIGTERM and SIGHUP: a handler records them in an atomic bit set, and the main
//! thread polls it between short waits (no self-pipe needed at a 25 ms tick).

use std::io;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

/// The signals that stop `etcd-sync` cleanly (release, then exit).
const HANDLED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Bit `n` set: signal `n` arrived and was not taken yet.
static PENDING: AtomicU64 = AtomicU64::new(0);

extern "C" fn record(signo: libc::c_int) {
    // Only an atomic read-modify-write: async-signal-safe.
    if (1..64).contains(&signo) {
        PENDING.fetch_or(1 << signo, Ordering::SeqCst);
    }
}

/// Installs the handlers. SIGINT and SIGTERM are always handled, even when inherited as
/// ignored (a non-interactive shell ignores SIGINT for `cmd &`): `kill -INT` must still
/// release the lock and stop, as it stops `etcdctl lock`. SIGHUP stays ignored if it was
/// (`nohup` asks for exactly that).
/// SIGCHLD is reset to its default so that a parent that ignored it cannot make the
/// kernel reap CMD before we read its exit status.
pub fn install() -> io::Result<()> {
    // SAFETY: plain sigaction calls with zero-initialised (valid) structs; the handler only
    // touches an atomic.
    unsafe {
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut default.sa_mask);
        if libc::sigaction(libc::SIGCHLD, &default, ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let handler: extern "C" fn(libc::c_int) = record;
        for signo in HANDLED {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signo, ptr::null(), &mut old) != 0 {
                return Err(io::Error::last_os_error());
            }
            if signo == libc::SIGHUP && old.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(signo, &action, ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Takes one pending signal (the lowest-numbered), if any arrived since the last call.
pub fn take() -> Option<libc::c_int> {
    loop {
        let pending = PENDING.load(Ordering::SeqCst);
        if pending == 0 {
            return None;
        }
        let signo = pending.trailing_zeros();
        let bit = 1u64 << signo;
        if PENDING.fetch_and(!bit, Ordering::SeqCst) & bit != 0 {
            return libc::c_int::try_from(signo).ok();
        }
    }
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
