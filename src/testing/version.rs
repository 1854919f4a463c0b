//! Which etcd the tests run, read from `etcd --version`, and the flags that version takes.
//!
//! Flags change between releases: etcd 3.6 dropped the `experimental-` prefix from flags it
//! made stable (`--experimental-watch-progress-notify-interval` became
//! `--watch-progress-notify-interval`) and moved others behind `--feature-gates`; 3.4 needs
//! `--logger=zap` to avoid its deprecated default logger. The testing module asks the
//! version first and passes only flags that version accepts.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use super::binary::etcd_binary;
use super::error::context;

/// An etcd server version, such as 3.5.1.
///
/// # Example
///
/// ```
/// use etcd_sync::testing::EtcdVersion;
///
/// let version = EtcdVersion::parse("etcd Version: 3.5.1\nGit SHA: e8732fb5f").unwrap();
/// assert_eq!(version.to_string(), "3.5.1");
/// assert!(version.at_least(3, 5));
/// assert!(!version.at_least(3, 6));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EtcdVersion {
    /// The major version: 3.
    pub major: u32,
    /// The minor version: 4, 5, 6...
    pub minor: u32,
    /// The patch release.
    pub patch: u32,
}

/// The oldest etcd the crate and its tests support: learners, `hasleader`, the v3 lock
/// and election services.
pub(super) const OLDEST: EtcdVersion = EtcdVersion {
    major: 3,
    minor: 4,
    patch: 0,
};

impl EtcdVersion {
    /// Reads the version from `etcd --version` output (`etcd Version: 3.4.23`), or from a
    /// bare `3.4.23`.
    ///
    /// # Example
    ///
    /// ```
    /// use etcd_sync::testing::EtcdVersion;
    ///
    /// let version = EtcdVersion::parse("3.4.23").unwrap();
    /// assert_eq!((version.major, version.minor, version.patch), (3, 4, 23));
    /// assert_eq!(EtcdVersion::parse("not a version"), None);
    /// ```
    pub fn parse(text: &str) -> Option<EtcdVersion> {
        let line = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("etcd Version:"))
            .unwrap_or(text);
        let number = line.trim().trim_start_matches('v');
        // "3.6.0-rc.1": the pre-release part does not change which flags exist.
        let number = number.split(['-', '+']).next()?;
        let mut parts = number.split('.').map(str::parse::<u32>);
        let version = EtcdVersion {
            major: parts.next()?.ok()?,
            minor: parts.next()?.ok()?,
            patch: parts.next().unwrap_or(Ok(0)).ok()?,
        };
        parts.next().is_none().then_some(version)
    }

    /// Whether this version is `major.minor` or newer.
    ///
    /// # Example
    ///
    /// ```
    /// let version = etcd_sync::testing::EtcdVersion::parse("3.4.23").unwrap();
    /// assert!(version.at_least(3, 4));
    /// assert!(!version.at_least(3, 5));
    /// ```
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }

    /// This version's spelling of an etcd flag given with its 3.4/3.5 name: from 3.6 on,
    /// `--experimental-X` is `--X` for the flags etcd made stable.
    ///
    /// # Example
    ///
    /// ```
    /// use etcd_sync::testing::EtcdVersion;
    ///
    /// let flag = "--experimental-watch-progress-notify-interval";
    /// assert_eq!(EtcdVersion::parse("3.5.1").unwrap().flag(flag), flag);
    /// assert_eq!(
    ///     EtcdVersion::parse("3.6.0").unwrap().flag(flag),
    ///     "--watch-progress-notify-interval"
    /// );
    /// ```
    pub fn flag(&self, name: &str) -> String {
        match name.strip_prefix("--experimental-") {
            Some(stable) if self.at_least(3, 6) && STABLE_IN_3_6.contains(&stable) => {
                format!("--{stable}")
            }
            _ => name.to_string(),
        }
    }
}

/// Flags that etcd 3.6 took out of `--experimental-` under the same name (3.7 drops the
/// old spelling).
const STABLE_IN_3_6: [&str; 4] = [
    "watch-progress-notify-interval",
    "warning-apply-duration",
    "snapshot-catch-up-entries",
    "compaction-batch-limit",
];

impl fmt::Display for EtcdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The version of the etcd binary the tests run ([`etcd_binary`]).
///
/// # Errors
///
/// As [`etcd_binary`]; if `etcd --version` cannot run or prints no version.
///
/// # Example
///
/// ```no_run
/// let version = etcd_sync::testing::etcd_version()?;
/// println!("testing against etcd {version}");
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn etcd_version() -> io::Result<EtcdVersion> {
    version_of(&etcd_binary()?)
}

/// The version of `binary`, asked once per binary per process.
pub(super) fn version_of(binary: &Path) -> io::Result<EtcdVersion> {
    static SEEN: OnceLock<Mutex<HashMap<PathBuf, EtcdVersion>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Mutex::default);
    let cached = seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(binary)
        .copied();
    if let Some(version) = cached {
        return Ok(version);
    }
    let output = Command::new(binary)
        .arg("--version")
        .env_clear()
        .output()
        .map_err(|e| context(e, format_args!("cannot run {} --version", binary.display())))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = EtcdVersion::parse(&text).ok_or_else(|| {
        io::Error::other(format!(
            "{} --version printed no etcd version: {:?}",
            binary.display(),
            text.trim()
        ))
    })?;
    if version < OLDEST {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{} is etcd {version}; etcd-sync needs etcd {}.{} or newer",
                binary.display(),
                OLDEST.major,
                OLDEST.minor
            ),
        ));
    }
    seen.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(binary.to_path_buf(), version);
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::EtcdVersion;

    #[test]
    fn versions_parse_from_etcd_output() {
        let v34 = EtcdVersion::parse("etcd Version: 3.4.23\nGit SHA: Not provided\n").unwrap();
        assert_eq!(v34.to_string(), "3.4.23");
        assert!(EtcdVersion::parse("3.6.0-rc.2").unwrap().at_least(3, 6));
        assert_eq!(EtcdVersion::parse("3.x"), None);
        assert_eq!(EtcdVersion::parse("3.5.1.2"), None);
        assert!(v34 < EtcdVersion::parse("3.5.0").unwrap());
        let progress = "--experimental-watch-progress-notify-interval";
        assert_eq!(v34.flag(progress), progress);
        let v36 = EtcdVersion::parse("3.6.4").unwrap();
        assert_eq!(v36.flag(progress), "--watch-progress-notify-interval");
        // Not one of the renamed ones (3.6 moved it behind a feature gate): left as is.
        assert_eq!(
            v36.flag("--experimental-initial-corrupt-check"),
            "--experimental-initial-corrupt-check"
        );
    }
}
