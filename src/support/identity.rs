//! Who a session is, for people reading the line: the value stored under every lock key
//! the session takes (`etcd-sync status`, [`Client::status`](crate::Client::status)).
//!
//! Go's `concurrency.Mutex` and `etcdctl lock` never read a lock key's value (theirs is
//! empty), so storing an identity there changes nothing for them.

use crate::support::error::{Error, Result};

/// The longest session identity accepted, in bytes (256).
///
/// ```
/// assert_eq!(etcd_sync::MAX_IDENTITY_LEN, 256);
/// ```
pub const MAX_IDENTITY_LEN: usize = 256;

/// `"<hostname>:<pid>"`: tells an operator which process to look at. The hostname is
/// `"unknown"` if the system will not say.
pub(crate) fn default_identity() -> String {
    format!("{}:{}", hostname(), std::process::id())
}

fn hostname() -> String {
    // HOST_NAME_MAX is 64 on Linux; 256 leaves room for any other system.
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    // A name that filled the buffer may lack its terminating NUL: take what is there.
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..len]);
    // Keep the default valid whatever the system returns: no control characters, bounded.
    let name: String = name.chars().filter(|c| !c.is_control()).take(64).collect();
    if name.is_empty() {
        "unknown".into()
    } else {
        name
    }
}

/// Checks an identity set by the user: non-empty, at most [`MAX_IDENTITY_LEN`] bytes, and
/// no control characters (it is printed on one line by `etcd-sync status`).
pub(crate) fn validate(identity: &str) -> Result<()> {
    if identity.is_empty() {
        return Err(Error::InvalidArgument(
            "empty session identity (leave it unset for \"<hostname>:<pid>\")".into(),
        ));
    }
    if identity.len() > MAX_IDENTITY_LEN {
        return Err(Error::InvalidArgument(format!(
            "session identity is {} bytes; at most {MAX_IDENTITY_LEN} are allowed",
            identity.len()
        )));
    }
    if identity.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(format!(
            "session identity {identity:?} contains a control character"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_host_and_pid_and_valid() {
        let identity = default_identity();
        let (host, pid) = identity.rsplit_once(':').unwrap_or_default();
        assert!(!host.is_empty(), "{identity}");
        assert_eq!(pid, std::process::id().to_string());
        assert!(validate(&identity).is_ok());
    }

    #[test]
    fn validation() {
        assert!(validate("worker-7").is_ok());
        assert!(validate(&"x".repeat(MAX_IDENTITY_LEN)).is_ok());
        for bad in [
            String::new(),
            "x".repeat(MAX_IDENTITY_LEN + 1),
            "a\nb".into(),
        ] {
            assert!(
                matches!(validate(&bad), Err(Error::InvalidArgument(_))),
                "{bad:?}"
            );
        }
    }
}
