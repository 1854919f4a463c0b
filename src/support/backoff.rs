//! The one retry rhythm of the crate: sleep, then double the pause, up to a cap, each pause
//! jittered so that many clients that failed together do not retry together.
//!
//! The jitter is "equal jitter": a pause is drawn between half and the whole of its
//! doubling ceiling, so no pause is longer than without jitter (every bound that held
//! before holds), none is shorter than half (no retry storm), and clients that lost etcd
//! at the same moment spread their reconnects over half of each step. The draw is a small
//! xorshift generator per thread, seeded from the boot clock, the process id and the
//! thread; [`seed_jitter`] makes a thread's draws reproducible (tests). A simulated run
//! turns the jitter off on its runtime's and its processes' threads ([`without_jitter`]):
//! its schedules, and so every seed pinned in tests and RELIABILITY.md, stay as they were,
//! and a seed replays.

use std::cell::Cell;
use std::time::Duration;

thread_local! {
    /// This thread's jitter generator (xorshift64*), or 0: no jitter on this thread.
    static JITTER: Cell<u64> = Cell::new(first_seed());
}

/// A seed that differs between processes and threads: the boot clock's nanoseconds, the
/// process id and the thread's id, mixed.
fn first_seed() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut thread = std::collections::hash_map::DefaultHasher::new();
    std::thread::current().id().hash(&mut thread);
    let nanos = crate::support::clock::boot_now().as_nanos() as u64;
    mix(nanos ^ u64::from(std::process::id()).rotate_left(32) ^ thread.finish())
}

/// SplitMix64's finaliser: spreads any input over all bits; never zero for a non-zero
/// input, and zero is mapped away below.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    if x == 0 { 0x9e37_79b9_7f4a_7c15 } else { x }
}

/// Makes this thread's jitter draws a function of `seed` from now on.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn seed_jitter(seed: u64) {
    JITTER.with(|state| state.set(mix(seed)));
}

/// Turns the jitter off on this thread: every pause is its whole step (a simulated run,
/// whose schedules must not change under the seeds pinned for it).
#[allow(dead_code)] // called only by the simulated world (testing/sim) and the tests below
pub(crate) fn without_jitter() {
    JITTER.with(|state| state.set(0));
}

/// The next draw of this thread's generator; `None` with the jitter off.
fn draw() -> Option<u64> {
    JITTER.with(|state| {
        let mut x = state.get();
        if x == 0 {
            return None;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.set(x);
        Some(x.wrapping_mul(0x2545_f491_4f6c_dd1d))
    })
}

/// A pause between half of `ceiling` and `ceiling` (both included), placed by `random`.
fn equal_jitter(ceiling: Duration, random: u64) -> Duration {
    let half = ceiling / 2;
    let spread = (ceiling - half).as_nanos();
    let extra = u128::from(random) % (spread + 1);
    // `extra` is at most half of a Duration, so it fits back into one.
    half + Duration::from_nanos(u64::try_from(extra).unwrap_or(u64::MAX))
}

/// Doubling pauses between retries, from `first` up to `cap`, each drawn between half and
/// the whole of its step.
pub(crate) struct Backoff {
    first: Duration,
    next: Duration,
    cap: Duration,
}

impl Backoff {
    pub(crate) fn new(first: Duration, cap: Duration) -> Backoff {
        Backoff {
            first,
            next: first,
            cap,
        }
    }

    /// From 20 ms to 1 s: retries of reads and watches, quick while a member fails over.
    pub(crate) fn quick() -> Backoff {
        Backoff::new(Duration::from_millis(20), Duration::from_secs(1))
    }

    /// The pause to take now: between half of its step and the whole (equal jitter); the
    /// next step is twice as long (up to the cap).
    pub(crate) fn next_pause(&mut self) -> Duration {
        let ceiling = self.next;
        self.next = (self.next * 2).min(self.cap);
        draw().map_or(ceiling, |random| equal_jitter(ceiling, random))
    }

    /// Sleeps for [`next_pause`](Backoff::next_pause).
    pub(crate) async fn sleep(&mut self) {
        tokio::time::sleep(self.next_pause()).await;
    }

    /// Back to the first pause after a success.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ceilings a backoff's pauses are drawn under, and their bounds.
    fn check_steps(b: &mut Backoff, ceilings: &[u64]) {
        for &ceiling in ceilings {
            let ceiling = Duration::from_millis(ceiling);
            let pause = b.next_pause();
            assert!(
                pause >= ceiling / 2 && pause <= ceiling,
                "{pause:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
        }
    }

    #[test]
    fn pauses_double_up_to_the_cap_and_reset() {
        for seed in 0..200 {
            seed_jitter(seed);
            let mut b = Backoff::new(Duration::from_millis(50), Duration::from_millis(150));
            check_steps(&mut b, &[50, 100, 150, 150, 150]);
            b.reset();
            check_steps(&mut b, &[50, 100]);
        }
    }

    #[test]
    fn the_jitter_spans_half_to_whole_and_spreads() {
        let ceiling = Duration::from_secs(1);
        assert_eq!(equal_jitter(ceiling, 0), ceiling / 2);
        assert_eq!(equal_jitter(ceiling, 500_000_000), ceiling);
        assert_eq!(
            equal_jitter(ceiling, u64::MAX),
            ceiling / 2 + Duration::from_nanos(u64::MAX % 500_000_001)
        );
        assert_eq!(equal_jitter(Duration::ZERO, 12345), Duration::ZERO);
        assert_eq!(
            equal_jitter(Duration::from_nanos(1), 1),
            Duration::from_nanos(1)
        );
        // Bounded for the largest ceilings too (a leader loop's cap is the user's).
        let huge = Duration::MAX;
        assert!(equal_jitter(huge, u64::MAX) >= huge / 2);
        // Draws spread over the range: ten bands of a second's step are all hit.
        seed_jitter(42);
        let mut bands = [0u32; 10];
        for _ in 0..1000 {
            let pause = equal_jitter(ceiling, draw().unwrap_or_default());
            assert!(pause >= ceiling / 2 && pause <= ceiling, "{pause:?}");
            let band = ((pause - ceiling / 2).as_nanos() * 10 / (ceiling / 2).as_nanos()) as usize;
            bands[band.min(9)] += 1;
        }
        assert!(bands.iter().all(|&n| n > 50), "{bands:?}");
    }

    #[test]
    fn a_seed_replays_and_threads_differ() {
        let pauses = |seed| {
            seed_jitter(seed);
            let mut b = Backoff::quick();
            (0..8).map(|_| b.next_pause()).collect::<Vec<_>>()
        };
        assert_eq!(pauses(7), pauses(7));
        assert_ne!(pauses(7), pauses(8));
        // Unseeded threads start apart (the seed mixes the thread in).
        let first = || std::thread::spawn(draw).join().ok().flatten();
        assert_ne!(first(), first());
        assert!(first().is_some());
    }

    #[test]
    fn without_jitter_every_pause_is_its_whole_step() {
        without_jitter();
        let mut b = Backoff::new(Duration::from_millis(50), Duration::from_millis(150));
        let pauses: Vec<_> = (0..4).map(|_| b.next_pause().as_millis()).collect();
        assert_eq!(pauses, [50, 100, 150, 150]);
        seed_jitter(1);
        assert!(draw().is_some());
    }
}
