//! A clock that keeps counting while the machine is suspended.
//!
//! `Instant` is CLOCK_MONOTONIC on Linux, which stops during host suspend or a paused VM,
//! while etcd's clock (and so the lease's TTL) runs on. A lease deadline measured only on
//! `Instant` would let `is_held()` say true for the rest of an old deadline after a resume.
//! Deadlines are therefore also kept on CLOCK_BOOTTIME, which counts suspended time.
//!
//! The rest of the library reads time only here (clippy's `disallowed_methods`, configured
//! in clippy.toml): in a simulated run an instant from [`now`] is virtual, and measuring it
//! against the wall clock (`Instant::elapsed`) would make what a seed does depend on how
//! fast the machine ran it.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

/// Now, on the clock every deadline and wait of the crate is measured on: the monotonic
/// clock. With the `simulation` feature it is read through tokio's clock
/// ([`virtual_now`](super::sim::virtual_now)), which is the same but in a simulated run
/// (`testing::sim`), whose paused runtime makes it virtual for every thread that entered
/// it.
pub(crate) fn now() -> Instant {
    super::sim::virtual_now().unwrap_or_else(Instant::now)
}

/// How long ago `earlier` was, on [`now`]'s clock.
pub(crate) fn since(earlier: Instant) -> Duration {
    now().saturating_duration_since(earlier)
}

/// How far [`now`]'s clock runs ahead of the monotonic one: zero but in a simulated run.
fn virtual_lead() -> Duration {
    super::sim::virtual_now().map_or(Duration::ZERO, |now| {
        now.saturating_duration_since(Instant::now())
    })
}

/// Time since boot, suspended time included (CLOCK_BOOTTIME), plus a simulated run's
/// virtual time; elsewhere than Linux, the monotonic clock's reading since first use.
pub(crate) fn boot_now() -> Duration {
    real_boot_now() + virtual_lead()
}

fn real_boot_now() -> Duration {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime only writes the timespec we pass.
        if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } == 0 {
            return Duration::new(ts.tv_sec.unsigned_abs(), ts.tv_nsec.unsigned_abs() as u32);
        }
    }
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// The boot-clock reading at which `deadline` (a monotonic instant) falls, measured now.
pub(crate) fn boot_deadline(deadline: Instant) -> Duration {
    boot_now() + deadline.saturating_duration_since(now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_advances_with_the_monotonic_clock() {
        let (boot, mono) = (boot_now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (boot_elapsed, mono_elapsed) = (boot_now() - boot, mono.elapsed());
        assert!(boot_elapsed >= Duration::from_millis(20));
        assert!(boot_elapsed.abs_diff(mono_elapsed) < Duration::from_millis(5));
    }
}
