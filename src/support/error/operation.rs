//! [`Operation`]: what was being done when an [`Error::Timeout`](crate::Error::Timeout)
//! ran out.

use std::fmt;

/// What an [`Error::Timeout`](crate::Error::Timeout) was doing when its limit ran out.
///
/// Two families, told apart by [`is_wait`](Operation::is_wait) (and on the error by
/// [`Error::is_wait_timeout`](crate::Error::is_wait_timeout)):
///
/// * **waits**, whose limit the caller gave: [`Lock`](Operation::Lock),
///   [`Read`](Operation::Read), [`Write`](Operation::Write),
///   [`Acquire`](Operation::Acquire), [`Campaign`](Operation::Campaign) and
///   [`Observe`](Operation::Observe), and the barriers' [`Barrier`](Operation::Barrier),
///   [`Enter`](Operation::Enter), [`Leave`](Operation::Leave) and
///   [`Latch`](Operation::Latch). The lock, permit, leadership, event or release did not
///   come in time; nothing is wrong with etcd.
/// * **requests**, bounded by the client's request timeout:
///   [`Request`](Operation::Request), [`OpenWatch`](Operation::OpenWatch) and
///   [`Release`](Operation::Release). etcd (or the network) was too slow.
///
/// `Display` prints the words the error message uses (`"lock"`, `"etcd request"`, ...);
/// [`as_str`](Operation::as_str) returns the same text. The enum is `#[non_exhaustive]`:
/// keep a `_` arm.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use etcd_sync::{Error, Operation};
/// let e = Error::Timeout {
///     operation: Operation::Lock,
///     after: Duration::from_secs(1),
///     endpoint: None,
/// };
/// assert_eq!(e.to_string(), "lock timed out after 1s");
/// match e {
///     Error::Timeout { operation, .. } if operation.is_wait() => println!("still busy"),
///     Error::Timeout { operation: Operation::Request, .. } => println!("etcd too slow"),
///     other => println!("{other}"),
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// One request to etcd that the member did not answer within the request timeout
    /// ([`ClientBuilder::request_timeout`](crate::ClientBuilder::request_timeout)); the
    /// error names the member in `endpoint`. Prints `etcd request`.
    ///
    /// ```
    /// assert_eq!(etcd_sync::Operation::Request.to_string(), "etcd request");
    /// ```
    Request,
    /// Opening a watch that etcd did not confirm within the request timeout. Prints
    /// `opening a watch`.
    ///
    /// ```
    /// assert_eq!(etcd_sync::Operation::OpenWatch.to_string(), "opening a watch");
    /// ```
    OpenWatch,
    /// Releasing a guard or resigning ([`Guard::release`](crate::Guard::release),
    /// [`Leadership::resign`](crate::Leadership::resign), ...): etcd did not confirm the
    /// delete within the request timeout, and the release goes on in the background.
    /// Prints `release (still retried in the background)`.
    ///
    /// ```
    /// use etcd_sync::Operation;
    /// assert!(!Operation::Release.is_wait());
    /// ```
    Release,
    /// The limit of [`Mutex::lock_timeout`](crate::Mutex::lock_timeout) or
    /// [`Mutex::lock_with`](crate::Mutex::lock_with). Prints `lock`.
    ///
    /// ```
    /// assert_eq!(etcd_sync::Operation::Lock.to_string(), "lock");
    /// ```
    Lock,
    /// The limit of [`RwLock::read_timeout`](crate::RwLock::read_timeout) or
    /// [`RwLock::read_with`](crate::RwLock::read_with). Prints `read`.
    ///
    /// ```
    /// assert_eq!(etcd_sync::Operation::Read.to_string(), "read");
    /// ```
    Read,
    /// The limit of [`RwLock::write_timeout`](crate::RwLock::write_timeout) or
    /// [`RwLock::write_with`](crate::RwLock::write_with). Prints `write`.
    ///
    /// ```
    /// assert_eq!(etcd_sync::Operation::Write.to_string(), "write");
    /// ```
    Write,
    /// The limit of [`Semaphore::acquire_timeout`](crate::Semaphore::acquire_timeout) or
    /// [`Semaphore::acquire_with`](crate::Semaphore::acquire_with). Prints `acquire`.
    ///
    /// ```
    /// assert_eq!(etcd_sync::Operation::Acquire.to_string(), "acquire");
    /// ```
    Acquire,
    /// The limit of [`Election::campaign_timeout`](crate::Election::campaign_timeout) or
    /// [`Election::campaign_with`](crate::Election::campaign_with) (a re-campaign's
    /// proclamation included). Prints `campaign`.
    ///
    /// ```
    /// assert_eq!(etcd_sync::Operation::Campaign.to_string(), "campaign");
    /// ```
    Campaign,
    /// The limit of [`Observer::recv_timeout`](crate::Observer::recv_timeout) or
    /// [`Observer::recv_with`](crate::Observer::recv_with): no leadership change came in
    /// time. Prints `observe`.
    ///
    /// ```
    /// assert_eq!(etcd_sync::Operation::Observe.to_string(), "observe");
    /// ```
    Observe,
    /// The limit of [`Barrier::wait_timeout`](crate::Barrier::wait_timeout) or
    /// [`Barrier::wait_with`](crate::Barrier::wait_with): the barrier was not released in
    /// time. Prints `barrier wait`.
    ///
    /// ```
    /// assert_eq!(etcd_sync::Operation::Barrier.to_string(), "barrier wait");
    /// ```
    Barrier,
    /// The limit of [`DoubleBarrier::enter_timeout`](crate::DoubleBarrier::enter_timeout)
    /// or [`DoubleBarrier::enter_with`](crate::DoubleBarrier::enter_with): fewer than the
    /// expected number of participants were in at once; our key was removed. Prints
    /// `enter`.
    ///
    /// ```
    /// assert_eq!(etcd_sync::Operation::Enter.to_string(), "enter");
    /// ```
    Enter,
    /// The limit of [`DoubleBarrier::leave_timeout`](crate::DoubleBarrier::leave_timeout)
    /// or [`DoubleBarrier::leave_with`](crate::DoubleBarrier::leave_with): others of our
    /// round had not left yet (our own key is gone already). Prints `leave`.
    ///
    /// ```
    /// assert_eq!(etcd_sync::Operation::Leave.to_string(), "leave");
    /// ```
    Leave,
    /// The limit of [`CountDownLatch::wait_timeout`](crate::CountDownLatch::wait_timeout)
    /// or [`CountDownLatch::wait_with`](crate::CountDownLatch::wait_with): the count did not
    /// reach zero in time. Prints `latch wait`.
    ///
    /// ```
    /// assert_eq!(etcd_sync::Operation::Latch.to_string(), "latch wait");
    /// ```
    Latch,
}

impl Operation {
    /// Every operation, waits last (for tests and exhaustive tables).
    #[cfg(test)]
    pub(crate) const ALL: [Operation; 13] = [
        Operation::Request,
        Operation::OpenWatch,
        Operation::Release,
        Operation::Lock,
        Operation::Read,
        Operation::Write,
        Operation::Acquire,
        Operation::Campaign,
        Operation::Observe,
        Operation::Barrier,
        Operation::Enter,
        Operation::Leave,
        Operation::Latch,
    ];

    /// True for a wait whose limit the caller gave (`lock`, `read`, `write`, `acquire`,
    /// `campaign`, `observe`): what it waited for stayed with others, or did not happen,
    /// for the whole limit. False for a request etcd did not answer in time.
    ///
    /// ```
    /// use etcd_sync::Operation;
    /// assert!(Operation::Lock.is_wait() && Operation::Observe.is_wait());
    /// assert!(!Operation::Request.is_wait() && !Operation::Release.is_wait());
    /// ```
    pub const fn is_wait(self) -> bool {
        match self {
            Operation::Lock
            | Operation::Read
            | Operation::Write
            | Operation::Acquire
            | Operation::Campaign
            | Operation::Observe
            | Operation::Barrier
            | Operation::Enter
            | Operation::Leave
            | Operation::Latch => true,
            Operation::Request | Operation::OpenWatch | Operation::Release => false,
        }
    }

    /// True for a wait that takes something ([`is_wait`](Operation::is_wait) and not
    /// [`Observe`](Operation::Observe), [`Barrier`](Operation::Barrier),
    /// [`Leave`](Operation::Leave) or [`Latch`](Operation::Latch)): a lock, a read or write
    /// lock, a permit, leadership or a place in a double barrier, which would have left a
    /// key in etcd had it succeeded. A timeout of such a wait leaves no key behind.
    ///
    /// ```
    /// use etcd_sync::Operation;
    /// assert!(Operation::Acquire.is_acquisition() && Operation::Campaign.is_acquisition());
    /// assert!(!Operation::Observe.is_acquisition() && !Operation::Request.is_acquisition());
    /// ```
    pub const fn is_acquisition(self) -> bool {
        self.is_wait()
            && !matches!(
                self,
                Operation::Observe | Operation::Barrier | Operation::Leave | Operation::Latch
            )
    }

    /// The words the error message uses for this operation (what `Display` prints).
    ///
    /// ```
    /// use etcd_sync::Operation;
    /// assert_eq!(Operation::Request.as_str(), "etcd request");
    /// assert_eq!(Operation::Campaign.as_str(), Operation::Campaign.to_string());
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            Operation::Request => "etcd request",
            Operation::OpenWatch => "opening a watch",
            Operation::Release => "release (still retried in the background)",
            Operation::Lock => "lock",
            Operation::Read => "read",
            Operation::Write => "write",
            Operation::Acquire => "acquire",
            Operation::Campaign => "campaign",
            Operation::Observe => "observe",
            Operation::Barrier => "barrier wait",
            Operation::Enter => "enter",
            Operation::Leave => "leave",
            Operation::Latch => "latch wait",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
