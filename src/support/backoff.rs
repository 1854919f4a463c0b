//! The one retry rhythm of the crate: sleep, then double the pause, up to a cap.

use std::time::Duration;

/// Doubling pauses between retries, from `first` up to `cap`.
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

    /// The pause to take now; the next one is twice as long (up to the cap).
    pub(crate) fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(self.cap);
        pause
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

    #[test]
    fn pauses_double_up_to_the_cap_and_reset() {
        let mut b = Backoff::new(Duration::from_millis(50), Duration::from_millis(150));
        assert_eq!(b.next_pause(), Duration::from_millis(50));
        assert_eq!(b.next_pause(), Duration::from_millis(100));
        assert_eq!(b.next_pause(), Duration::from_millis(150));
        assert_eq!(b.next_pause(), Duration::from_millis(150));
        b.reset();
        assert_eq!(b.next_pause(), Duration::from_millis(50));
    }
}
