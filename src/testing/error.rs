//! Error messages that say which file, process or request failed.

use std::fmt;
use std::io;

/// Prefixes an error's message, keeping its kind.
pub(super) fn context(error: io::Error, what: impl fmt::Display) -> io::Error {
    io::Error::new(error.kind(), format!("{what}: {error}"))
}
