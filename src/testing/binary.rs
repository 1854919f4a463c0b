//! Finding the `etcd` and `etcdctl` binaries to run.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Returns the etcd server binary to run.
///
/// Uses the `ETCD_BIN` environment variable if it is set (an error if that file does not
/// exist), else `etcd` found on `PATH`, else `/usr/bin/etcd`.
///
/// # Errors
///
/// [`io::ErrorKind::NotFound`] if `ETCD_BIN` names a missing file, or if no binary is found:
/// "etcd binary not found: set ETCD_BIN to an etcd 3.4+ binary, or install Debian's
/// package: apt-get install etcd-server".
///
/// # Example
///
/// ```no_run
/// let etcd = etcd_sync::testing::etcd_binary()?;
/// println!("using {}", etcd.display());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn etcd_binary() -> io::Result<PathBuf> {
    find_binary("ETCD_BIN", "etcd", "etcd-server")
}

/// Returns the `etcdctl` binary, for tests that want to poke at a server from the outside.
///
/// Uses the `ETCDCTL_BIN` environment variable if it is set (an error if that file does not
/// exist), else the `etcdctl` beside `ETCD_BIN` when that is set and has one (so interop
/// tests talk to the server with its own version's client), else `etcdctl` found on `PATH`,
/// else `/usr/bin/etcdctl`.
///
/// # Errors
///
/// [`io::ErrorKind::NotFound`] if `ETCDCTL_BIN` names a missing file, or if no binary is
/// found: "etcdctl binary not found: set ETCDCTL_BIN to an etcdctl 3.4+ binary, or install
/// Debian's package: apt-get install etcd-client".
///
/// # Example
///
/// ```no_run
/// use etcd_sync::testing::{etcdctl_binary, EtcdServer};
///
/// let etcd = EtcdServer::start()?;
/// let status = std::process::Command::new(etcdctl_binary()?)
///     .env("ETCDCTL_API", "3")
///     .args(["--endpoints", &etcd.endpoint(), "put", "greeting", "hello"])
///     .status()?;
/// assert!(status.success());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn etcdctl_binary() -> io::Result<PathBuf> {
    if std::env::var_os("ETCDCTL_BIN").is_none_or(|value| value.is_empty()) {
        let beside_server = std::env::var_os("ETCD_BIN")
            .filter(|value| !value.is_empty())
            .and_then(|server| Some(Path::new(&server).parent()?.join("etcdctl")))
            .filter(|candidate| is_executable(candidate));
        if let Some(path) = beside_server {
            return Ok(path);
        }
    }
    find_binary("ETCDCTL_BIN", "etcdctl", "etcd-client")
}

fn find_binary(env_var: &str, name: &str, package: &str) -> io::Result<PathBuf> {
    if let Some(value) = std::env::var_os(env_var).filter(|value| !value.is_empty()) {
        let path = PathBuf::from(value);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{env_var} is set to {}, but that file does not exist",
                    path.display()
                ),
            ))
        };
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .filter(|dir| !dir.as_os_str().is_empty())
            .map(|dir| dir.join(name))
            .find(|candidate| is_executable(candidate))
    });
    if let Some(path) = on_path {
        return Ok(path);
    }
    let fallback = Path::new("/usr/bin").join(name);
    if is_executable(&fallback) {
        return Ok(fallback);
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "{name} binary not found: set {env_var} to an {name} 3.4+ binary, \
             or install Debian's package: apt-get install {package}"
        ),
    ))
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}
