//! Error messages that say which file, process or request failed.

use std::fmt;
use std::io;

/// Prefixes an error's message, keeping its kind.
pub(super) fn context(error: io::Error, what: impl fmt::Display) -> io::Error {
    io::Error::new(error.kind(), format!("{what}: {error}"))
}

/// An error whose message is the whole story: `{:?}` (what `unwrap()` and a `main` that
/// returns the error print) shows it as `{}` does, not as an escaped string.
pub(super) fn explained(kind: io::ErrorKind, message: String) -> io::Error {
    io::Error::new(kind, Explained(message))
}

struct Explained(String);

impl fmt::Display for Explained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Explained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Explained {}
