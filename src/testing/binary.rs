//! Finding the `etcd` and `etcdctl` binaries to run.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::error::explained;

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
/// [`io::ErrorKind::NotFound`] if `ETCD_BIN` names a missing file, or if no binary is found.
/// The message says where it looked and the three ways out: the cargo feature
/// `vendored-etcd`, the `ETCD_BIN` variable, or an etcd installed on `PATH` (with
/// `vendored-etcd` on a platform the vendored binaries do not cover, it names the platform
/// instead of suggesting the feature). It reads the same through `{}` and `{:?}` (an
/// `unwrap()` shows the message, not an escaped string).
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
/// found: the message says where it looked, to set `ETCDCTL_BIN`, or to install one
/// (Debian's package `etcd-client`; the feature `vendored-etcd` ships no `etcdctl`).
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
            Err(explained(
                io::ErrorKind::NotFound,
                set_but_missing(env_var, name, &path),
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
    Err(explained(
        io::ErrorKind::NotFound,
        not_found(env_var, name, package, &fallback, Vendored::here()),
    ))
}

/// What the feature `vendored-etcd` can do about a missing etcd here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Vendored {
    /// The feature is off: turning it on is the easiest fix.
    Off,
    /// The feature is on, but has no binary for this platform (or lost its mode bits).
    NoneHere,
}

impl Vendored {
    fn here() -> Vendored {
        if cfg!(feature = "vendored-etcd") {
            Vendored::NoneHere
        } else {
            Vendored::Off
        }
    }
}

/// "`ETCD_BIN` is set to a missing file", with what to do.
fn set_but_missing(env_var: &str, name: &str, path: &Path) -> String {
    format!(
        "{env_var} is set to {}, but that file does not exist: point it at an {name} 3.4+ \
         binary, or unset it to let etcd-sync find one",
        path.display()
    )
}

/// "No binary found", with where we looked and every way out.
fn not_found(
    env_var: &str,
    name: &str,
    package: &str,
    fallback: &Path,
    vendored: Vendored,
) -> String {
    let install = format!(
        "install {name} on PATH (Debian/Ubuntu: apt-get install {package}; macOS: brew \
         install etcd)"
    );
    let set = format!("set {env_var}=/path/to/{name} (an {name} 3.4 or newer)");
    let looked = format!("not on PATH, not at {}", fallback.display());
    if name != "etcd" {
        // The vendored crates ship the server only.
        return format!(
            "{name} binary not found ({looked}; the feature vendored-etcd ships etcd, not \
             {name}): {set}, or {install}"
        );
    }
    match vendored {
        Vendored::Off => format!(
            "{name} binary not found ({looked}): turn on the cargo feature `vendored-etcd` \
             (features = [\"testing\", \"vendored-etcd\"]) to run the official etcd release \
             from the crate registry, nothing to install; or {set}; or {install}"
        ),
        Vendored::NoneHere => format!(
            "{name} binary not found ({looked}, and the feature `vendored-etcd` has no etcd \
             binary for {}-{}: it covers Linux x86_64/aarch64 and macOS): {set}, or {install}",
            std::env::consts::OS,
            std::env::consts::ARCH
        ),
    }
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_names_the_feature_and_the_variable() {
        let fallback = Path::new("/usr/bin/etcd");
        let off = not_found("ETCD_BIN", "etcd", "etcd-server", fallback, Vendored::Off);
        assert!(off.starts_with("etcd binary not found (not on PATH, not at /usr/bin/etcd)"));
        for part in [
            "`vendored-etcd`",
            "features = [\"testing\", \"vendored-etcd\"]",
            "set ETCD_BIN=/path/to/etcd",
            "apt-get install etcd-server",
        ] {
            assert!(off.contains(part), "{part}: {off}");
        }
        let none = not_found(
            "ETCD_BIN",
            "etcd",
            "etcd-server",
            fallback,
            Vendored::NoneHere,
        );
        assert!(none.contains("has no etcd binary for"), "{none}");
        assert!(none.contains("set ETCD_BIN="), "{none}");
        assert!(!none.contains("turn on"), "{none}");
        let ctl = not_found(
            "ETCDCTL_BIN",
            "etcdctl",
            "etcd-client",
            Path::new("/usr/bin/etcdctl"),
            Vendored::Off,
        );
        assert!(ctl.contains("set ETCDCTL_BIN=/path/to/etcdctl"), "{ctl}");
        assert!(ctl.contains("ships etcd, not etcdctl"), "{ctl}");
    }

    #[test]
    fn the_message_reads_the_same_in_debug() {
        let error = explained(
            io::ErrorKind::NotFound,
            set_but_missing("ETCD_BIN", "etcd", Path::new("/nonexistent/etcd")),
        );
        let (shown, debug) = (error.to_string(), format!("{error:?}"));
        assert!(
            shown.starts_with("ETCD_BIN is set to /nonexistent/etcd, but"),
            "{shown}"
        );
        assert!(debug.contains(&shown), "{debug}");
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
    }
}
