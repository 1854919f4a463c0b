//! Finding the `etcd` and `etcdctl` binaries to run.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Returns the etcd server binary to run.
///
/// Uses the `ETCD_BIN` environment variable if it is set (an error if that file does not
/// exist); else, with the cargo feature `vendored-etcd`, the official etcd release binary
/// that came with the crate `etcd-bin-vendored` (nothing to install); else `etcd` found on
/// `PATH`, else `/usr/bin/etcd`. The servers started report the version they run
/// ([`EtcdServer::version`](super::EtcdServer::version)), and the choice is logged
/// (`tracing`, target `etcd_sync::testing`).
///
/// # Errors
///
/// [`io::ErrorKind::NotFound`] if `ETCD_BIN` names a missing file, or if no binary is found:
/// "etcd binary not found: set ETCD_BIN to an etcd 3.4+ binary, or install Debian's
/// package: apt-get install etcd-server" (with `vendored-etcd` on a platform the vendored
/// binaries do not cover, the message names the platform too).
///
/// # Example
///
/// ```no_run
/// let etcd = etcd_sync::testing::etcd_binary()?;
/// println!("using {}", etcd.display());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn etcd_binary() -> io::Result<PathBuf> {
    let explicit = std::env::var_os("ETCD_BIN").is_some_and(|value| !value.is_empty());
    let (path, source) = match vendored() {
        Some(path) if !explicit => (path, "vendored (crate etcd-bin-vendored)"),
        _ if explicit => (find_binary("ETCD_BIN", "etcd", "etcd-server")?, "ETCD_BIN"),
        _ => (find_binary("ETCD_BIN", "etcd", "etcd-server")?, "PATH"),
    };
    tracing::debug!(target: "etcd_sync::testing", binary = %path.display(), source, "found etcd");
    Ok(path)
}

/// The etcd binary of the crate `etcd-bin-vendored` (feature `vendored-etcd`), if this
/// platform has one.
fn vendored() -> Option<PathBuf> {
    #[cfg(all(
        feature = "vendored-etcd",
        any(
            all(
                target_os = "linux",
                any(target_arch = "x86_64", target_arch = "aarch64")
            ),
            target_os = "macos"
        )
    ))]
    if let Ok(path) = etcd_bin_vendored::etcd_bin_path() {
        let path = path.to_path_buf();
        // The crate ships it executable; a copy that lost its mode bits (some vendoring
        // tools drop them) is passed over rather than failing with "permission denied".
        if is_executable(&path) {
            return Some(path);
        }
    }
    None
}

/// What `vendored-etcd` adds to a "not found" message: why it did not provide etcd here.
fn vendored_note() -> String {
    if cfg!(feature = "vendored-etcd") {
        format!(
            " (the feature vendored-etcd has no etcd binary for {}-{}: it covers Linux \
             x86_64/aarch64 and macOS)",
            std::env::consts::OS,
            std::env::consts::ARCH
        )
    } else {
        String::new()
    }
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
    let note = if name == "etcd" {
        vendored_note()
    } else {
        String::new()
    };
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "{name} binary not found{note}: set {env_var} to an {name} 3.4+ binary, \
             or install Debian's package: apt-get install {package}"
        ),
    ))
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}
