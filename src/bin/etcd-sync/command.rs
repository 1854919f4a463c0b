//! Running CMD while holding: its exit code passed through, signals forwarded to it, and
//! its process group stopped when the lock or leadership is lost (or, with
//! `--release-on-request`, when someone asks for it).

use std::io;
use std::thread;
use std::time::Instant;

use etcd_sync::Session;

use crate::args::HoldOpts;
use crate::child;
use crate::exit::{EXIT_CANNOT_EXECUTE, EXIT_ERROR, EXIT_NOT_FOUND, Exit};
use crate::hold::{Held, abandon, asked, loss_reason, release};
use crate::signals;
use crate::wait::TICK;

/// Runs CMD while holding; stops it on loss (exit 3) and forwards signals to it; releases
/// afterwards and passes its exit code through.
pub fn run_command(session: &Session, held: Held, opts: &HoldOpts) -> Exit {
    let program = opts
        .command
        .first()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut child = match child::Child::spawn(&opts.command, &held.env()) {
        Ok(child) => child,
        Err(e) => {
            eprintln!("etcd-sync: cannot run {program:?}: {e}");
            let code = if e.kind() == io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXECUTE
            };
            return release(session, held, code);
        }
    };
    let lost = held.lost();
    let requests = held.release_requests(opts);
    let mut is_lost = false;
    // Set once we started stopping CMD (loss or signal): when its group gets SIGKILL.
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let code = loop {
        let status = match child.poll() {
            Ok(status) => status,
            Err(e) => {
                // Cannot happen for our own child; stop it rather than hold blindly.
                eprintln!("etcd-sync: cannot wait for {program:?}: {e}");
                child.signal_group(libc::SIGKILL);
                break EXIT_ERROR;
            }
        };
        if let Some(code) = status {
            // After CMD exits on its own, what it left in its group is not our business;
            // once we are stopping it, we stop its whole group.
            if kill_at.is_none() || killed || !child.group_alive() {
                break code;
            }
        }
        if let Some(signo) = signals::take() {
            child.signal_group(signo);
            kill_at.get_or_insert_with(|| Instant::now() + opts.kill_grace);
        }
        if let Ok(request) = requests.try_recv() {
            eprintln!(
                "etcd-sync: {}; stopping {program:?} (SIGTERM, SIGKILL after {:?})",
                asked(held.what(), &request),
                opts.kill_grace
            );
            child.signal_group(libc::SIGTERM);
            kill_at.get_or_insert_with(|| Instant::now() + opts.kill_grace);
        }
        if !is_lost && lost.try_recv() == Err(crossbeam_channel::TryRecvError::Disconnected) {
            is_lost = true;
            eprintln!(
                "etcd-sync: {} lost: {}; stopping {program:?} (SIGTERM, SIGKILL after {:?})",
                held.what(),
                loss_reason(session),
                opts.kill_grace
            );
            child.signal_group(libc::SIGTERM);
            let deadline = Instant::now() + opts.kill_grace;
            kill_at = Some(kill_at.map_or(deadline, |at| at.min(deadline)));
        }
        if !killed && kill_at.is_some_and(|at| Instant::now() >= at) {
            child.signal_group(libc::SIGKILL);
            killed = true;
        }
        if is_lost {
            thread::sleep(TICK);
        } else {
            // Sleeps one tick, or wakes at once when the lock is lost.
            let _ = lost.recv_timeout(TICK);
        }
    };
    child.restore_terminal();
    if is_lost {
        return abandon(held);
    }
    release(session, held, code)
}
