//! [`Code`]: the gRPC status codes etcd answers with.

/// gRPC status codes, as etcd reports them in [`Error::Server`](crate::Error::Server).
///
/// # Example
///
/// ```
/// use etcd_sync::Code;
/// assert_ne!(Code::NotFound, Code::Unavailable);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)]
pub enum Code {
    Ok,
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}
