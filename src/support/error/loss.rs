//! [`LossReason`]: why a session ended.

use std::fmt;

/// Why a [`Session`](crate::Session) ended.
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let session = client.session()?;
/// session.close()?;
/// assert_eq!(session.loss_reason(), Some(etcd_sync::LossReason::Closed));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// [`Session::close`](crate::Session::close) was called (or the session was dropped).
    Closed,
    /// [`Session::orphan`](crate::Session::orphan) stopped the keep-alive.
    Orphaned,
    /// etcd says the lease does not exist: it was revoked, or it expired on the server.
    Revoked,
    /// No keep-alive was acknowledged in time (etcd unreachable, or refusing every
    /// keep-alive): the lease may have expired on the server,
    /// so it is treated as gone (see [`Session::valid_until`](crate::Session::valid_until)).
    Expired,
    /// The client was shut down.
    ClientClosed,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Closed => f.write_str("the session was closed"),
            LossReason::Orphaned => f.write_str("the session was orphaned"),
            LossReason::Revoked => f.write_str("etcd reports the lease revoked or expired"),
            LossReason::Expired => {
                f.write_str("no keep-alive was acknowledged before the lease deadline")
            }
            LossReason::ClientClosed => f.write_str("the client was shut down"),
        }
    }
}
