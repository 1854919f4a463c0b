//! Turning on etcd's authentication with the real `etcdctl`, as an operator would.

use std::io;

use super::certs::TlsCerts;
use super::etcdctl;

/// The root user [`EtcdServer::enable_auth`](super::EtcdServer::enable_auth) creates:
/// `(name, password)`.
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::{AUTH_ROOT, EtcdServer};
///
/// let etcd = EtcdServer::start()?;
/// etcd.enable_auth()?;
/// let admin = etcd_sync::Client::builder()
///     .endpoints(etcd.endpoints())
///     .user(AUTH_ROOT.0, AUTH_ROOT.1)
///     .connect()?;
/// # let _ = admin;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const AUTH_ROOT: (&str, &str) = ("root", "root-secret");

/// The restricted user [`EtcdServer::enable_auth`](super::EtcdServer::enable_auth)
/// creates: `(name, password)`. Its role `app` may read and write keys starting with
/// [`AUTH_PREFIX`] only.
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::{AUTH_USER, EtcdServer};
///
/// let etcd = EtcdServer::start()?;
/// etcd.enable_auth()?;
/// let app = etcd_sync::Client::builder()
///     .endpoints(etcd.endpoints())
///     .user(AUTH_USER.0, AUTH_USER.1)
///     .connect()?;
/// # let _ = app;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const AUTH_USER: (&str, &str) = ("app", "app-secret");

/// The key prefix [`AUTH_USER`] may use.
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::{AUTH_PREFIX, AUTH_USER, EtcdServer};
///
/// let etcd = EtcdServer::start()?;
/// etcd.enable_auth()?;
/// let app = etcd_sync::Client::builder()
///     .endpoints(etcd.endpoints())
///     .user(AUTH_USER.0, AUTH_USER.1)
///     .connect()?;
/// app.put(format!("{AUTH_PREFIX}config"), "allowed")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const AUTH_PREFIX: &str = "app/";

/// Creates the root user, a restricted user and role, and enables auth, with `etcdctl`.
pub(super) fn enable_auth(endpoint: &str, tls: Option<&TlsCerts>) -> io::Result<()> {
    let root = format!("{}:{}", AUTH_ROOT.0, AUTH_ROOT.1);
    let user = format!("{}:{}", AUTH_USER.0, AUTH_USER.1);
    let prefix_end = "app0"; // AUTH_PREFIX with its last byte incremented
    let steps: [&[&str]; 6] = [
        &["user", "add", &root, "--interactive=false"],
        &["role", "add", AUTH_USER.0],
        &[
            "role",
            "grant-permission",
            AUTH_USER.0,
            "readwrite",
            AUTH_PREFIX,
            prefix_end,
        ],
        &["user", "add", &user, "--interactive=false"],
        &["user", "grant-role", AUTH_USER.0, AUTH_USER.0],
        &["auth", "enable"],
    ];
    for args in steps {
        etcdctl::run(endpoint, tls, args)?;
    }
    Ok(())
}
