//! May this thread block? A blocking call on a thread that drives async tasks would panic
//! ("Cannot start a runtime from within a runtime") or stall the caller's executor: there
//! the crate returns `Error::InsideAsyncRuntime` instead (docs/design/blocking-seam.md).

use crate::support::error::{Error, Result};

/// Returns `Err(InsideAsyncRuntime)` on a thread that drives async tasks, where a blocking
/// call would panic ("Cannot start a runtime from within a runtime") or stall the caller's
/// executor. Threads of `spawn_blocking` and closures of `block_in_place` may block.
pub(crate) fn ensure_blocking_allowed() -> Result<()> {
    if inside_async() {
        return Err(Error::InsideAsyncRuntime);
    }
    Ok(())
}

/// True when the current thread drives async tasks: a tokio worker thread, or a thread
/// inside a runtime's `block_on`. False on plain threads, on `spawn_blocking` threads and
/// inside `block_in_place`, although tokio's handle is reachable from all three.
pub(crate) fn inside_async() -> bool {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return false; // a plain thread: no tokio context at all
    };
    if cfg!(panic = "abort") {
        // The probe below needs unwinding; without it, refuse in any tokio context.
        return true;
    }
    // tokio has no public "may this thread block?" query (tokio-rs/tokio#3559, #7769);
    // `Handle::block_on` asks exactly that, and panics when the answer is no. An empty
    // future makes the probe cost nothing where blocking is allowed.
    install_quiet_probe_hook();
    PROBING.with(|probing| probing.set(true));
    let refused =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle.block_on(async {})))
            .is_err();
    PROBING.with(|probing| probing.set(false));
    refused
}

thread_local! {
    /// Set while this thread runs the blocking probe: its expected panic is not reported.
    static PROBING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Chains a panic hook (once, the first time a call comes from inside a tokio context)
/// that stays silent for the probe's own panic and hands every other panic to the hook
/// that was installed before, unchanged. Without it each refused call would print tokio's
/// panic message (and capture a backtrace under RUST_BACKTRACE).
fn install_quiet_probe_hook() {
    // Not while this thread unwinds (a guard dropped by a panic): `take_hook` would panic
    // again, and a panic in a destructor while unwinding aborts. The probe's panic is
    // then reported by the hook in place, once.
    if std::thread::panicking() {
        return;
    }
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !PROBING.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
}
