//! Handing leadership to a chosen waiting candidate (`docs/election.md`, the design in
//! docs/design/handover.md): `Leadership::hand_over` and its timed and cancellable forms.

use std::time::Duration;

use crate::ownership::handover::To;
use crate::ownership::{self, Wait};
use crate::recipes::guard::{Guard, LeaderKind};
use crate::recipes::holder::Holder;
use crate::support::cancel::WaitOptions;
use crate::support::error::Result;

impl Guard<LeaderKind> {
    /// Hands our leadership to the waiting candidate `to` (its key, as
    /// [`Election::status`](crate::Election::status) lists it, or its value), within the
    /// client's request timeout; the new leader as etcd now shows it.
    ///
    /// The candidate **adopts our key**: one transaction puts it with the candidate's value
    /// on the candidate's lease and deletes the candidate's own key, so there is no instant
    /// with two leaders and none without one, and every other candidate (Go's and
    /// `etcdctl elect`'s included) keeps its place. Observers see an ordinary change of
    /// leader (a new value and lease under the same key). Before that, the candidate's
    /// campaign confirms that it still waits and will take it; its `campaign` then returns
    /// a [`Leadership`](crate::Leadership) whose fencing token is greater than ours. A
    /// candidate passed over (waiting between us and `to`) gets a smaller token than `to`'s
    /// when it leads later; [`hand_over_next`](Guard::hand_over_next) passes nobody over.
    ///
    /// On success this guard no longer leads: [`is_leader`](Guard::is_leader) is false,
    /// [`lost`](Guard::lost) fires, and `Drop` deletes nothing. This session cannot
    /// campaign on the name again while the successor holds the key (it is named after
    /// our lease): campaign on a new session.
    ///
    /// # Errors
    ///
    /// * [`Error::HandOverFailed`](crate::Error::HandOverFailed): no candidate `to` waits
    ///   behind us, its session ended, it did not take it in time (a candidate of another
    ///   client never does: only this crate's campaigns answer), or another hand-over to
    ///   it was under way. **We still lead**; the request left in etcd is removed.
    /// * [`Error::NotLeader`](crate::Error::NotLeader): we no longer lead: our key went
    ///   or changed hands, or (when etcd's answer to the hand-over was lost) the candidate
    ///   took it and let go before we could read it back: then it did lead.
    ///   [`Error::SessionLost`](crate::Error::SessionLost): our session is lost, and the
    ///   hand-over may have happened.
    /// * [`Error::Server`](crate::Error::Server): etcd refused a step, e.g.
    ///   [`Code::PermissionDenied`](crate::Code::PermissionDenied) when our role may read
    ///   the candidate's key but not delete it, which the last step does. **We still
    ///   lead** (the step's Txn applied nothing); the request is removed.
    /// * [`Error::Timeout`](crate::Error::Timeout) /
    ///   [`Error::Unavailable`](crate::Error::Unavailable) with
    ///   [`Operation::Request`](crate::Operation::Request): etcd did not answer; ask
    ///   [`is_leader`](Guard::is_leader), or etcd, who leads.
    /// * [`Error::InsideAsyncRuntime`](crate::Error::InsideAsyncRuntime): called on an
    ///   async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let election = session.election("scheduler")?;
    /// let leadership = election.campaign("host-a")?;
    /// // ... host-b campaigns on its own session and waits behind us ...
    /// let next = leadership.hand_over("host-b")?;
    /// assert_eq!(next.value, b"host-b");
    /// assert!(!leadership.is_leader());
    /// # Ok(()) }
    /// ```
    pub fn hand_over(&self, to: impl AsRef<[u8]>) -> Result<Holder> {
        let timeout = self.held.request_timeout();
        self.hand_over_until(To::Named(to.as_ref()), Wait::from_timeout(timeout))
    }

    /// [`hand_over`](Guard::hand_over), waiting up to `timeout` for the candidate to take
    /// it; past it, [`Error::HandOverFailed`](crate::Error::HandOverFailed) and we still
    /// lead.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let leadership = session.election("e")?.campaign("a")?;
    /// match leadership.hand_over_timeout("b", std::time::Duration::from_secs(2)) {
    ///     Ok(next) => println!("{} leads now", next.value_str()),
    ///     Err(e) if e.is_hand_over_failed() => println!("still leading: {e}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn hand_over_timeout(&self, to: impl AsRef<[u8]>, timeout: Duration) -> Result<Holder> {
        self.hand_over_until(To::Named(to.as_ref()), Wait::from_timeout(timeout))
    }

    /// [`hand_over`](Guard::hand_over) with a timeout and a cancel token
    /// ([`Error::Cancelled`](crate::Error::Cancelled): we still lead).
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let token = etcd_sync::CancelToken::new();
    /// let leadership = session.election("e")?.campaign("a")?;
    /// let options = etcd_sync::WaitOptions::new().cancel_token(&token);
    /// let next = leadership.hand_over_with("b", options)?;
    /// # Ok(()) }
    /// ```
    pub fn hand_over_with(&self, to: impl AsRef<[u8]>, options: WaitOptions) -> Result<Holder> {
        self.hand_over_until(To::Named(to.as_ref()), Wait::from_options(options))
    }

    /// [`hand_over`](Guard::hand_over) to whoever waits first in line behind us, as the
    /// hand-over's own read of the name finds it: nobody is passed over, so the
    /// successor's fencing token is the least of the waiters' and tokens keep growing for
    /// everyone who leads later. (A key read from [`status`](crate::Election::status) and
    /// then named may have been deleted and created again, behind others, before the
    /// hand-over reads it.) If the first in line is no candidate of this crate (a `Mutex`
    /// waiter, `etcdctl`, Go) it never answers: [`Error::HandOverFailed`] after the limit,
    /// and we still lead.
    ///
    /// [`Error::HandOverFailed`]: crate::Error::HandOverFailed
    ///
    /// # Errors
    ///
    /// As [`hand_over`](Guard::hand_over); `HandOverFailed` also when nobody waits behind
    /// us.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let leadership = session.election("scheduler")?.campaign("host-a")?;
    /// // ... other hosts campaign on their own sessions ...
    /// let next = leadership.hand_over_next()?;
    /// println!("{} leads now", next.value_str());
    /// # Ok(()) }
    /// ```
    pub fn hand_over_next(&self) -> Result<Holder> {
        let timeout = self.held.request_timeout();
        self.hand_over_until(To::Next, Wait::from_timeout(timeout))
    }

    /// [`hand_over_next`](Guard::hand_over_next) with a timeout and a cancel token
    /// ([`Error::Cancelled`](crate::Error::Cancelled): we still lead).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let leadership = session.election("e")?.campaign("a")?;
    /// let options = etcd_sync::WaitOptions::new().timeout(Duration::from_secs(2));
    /// match leadership.hand_over_next_with(options) {
    ///     Ok(next) => println!("{} leads now", next.value_str()),
    ///     Err(e) if e.is_hand_over_failed() => println!("still leading: {e}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn hand_over_next_with(&self, options: WaitOptions) -> Result<Holder> {
        self.hand_over_until(To::Next, Wait::from_options(options))
    }

    fn hand_over_until(&self, to: To<'_>, wait: Wait) -> Result<Holder> {
        let kv = ownership::hand_over(&self.held, to, &wait)?;
        Ok(Holder::of(self.held.prefix(), kv, None))
    }
}
