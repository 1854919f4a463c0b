//! A leader's key **handed over** to a waiting candidate (`ownership/handover.rs`,
//! docs/design/handover.md): the key keeps its name (after the old leader's lease) and its
//! create revision, and carries the successor's lease and value. So a key's name no longer
//! tells whose it is: its `lease` field does.

use crate::support::error::{Error, Result};
use crate::support::kv::{KeyValue, text};

/// A leader's key handed over to a waiting candidate: it keeps its name and create
/// revision, and carries the candidate's lease and value from the handover's revision on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handed {
    pub(crate) key: Vec<u8>,
    /// Its create revision (the old leader's).
    pub(crate) rev: i64,
    /// Its mod revision when read: the handover's, the value's base for proclamations.
    pub(crate) value_rev: i64,
}

/// `Ok` if `mine`, a key named after our lease, is bound to it. A leadership handed over
/// (`ownership/handover.rs`) leaves the old leader's key on the successor's lease: that key
/// is the successor's, and neither adopting nor replacing it is ours to do.
pub(crate) fn not_handed_over(mine: &KeyValue, lease: i64) -> Result<()> {
    if mine.lease == lease {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "{} is bound to lease {:x}, not this session's {lease:x}: it was handed over to \
         another session, which holds it now; campaign or lock on a new session",
        text(&mine.key),
        mine.lease
    )))
}

/// The suffix of a name under which its hand-over requests are kept (`<name>.handover/`).
const HANDOVERS: &[u8] = b".handover/";

/// The hand-over request addressed to `key`, a candidate's key under `<name>/`:
/// `<name>.handover/<the rest of key>`, bound to the *leader's* lease (it goes with the
/// leader's session), outside `<name>/` so that no line counts it. `None` if `key` is not
/// under `<name>/`.
pub(crate) fn request_key(name: &[u8], key: &[u8]) -> Option<Vec<u8>> {
    crate::line::request::beside(name, HANDOVERS, key)
}

/// The request's value: "hand over to the key created at `rev`", so that a request meant
/// for an earlier key of the same session is not answered.
pub(crate) fn request_value(rev: i64) -> Vec<u8> {
    format!("handover to={rev}").into_bytes()
}

/// The candidate's answer, written over the request (same key, the leader's lease): "the
/// key created at `rev` still waits, and takes it".
pub(crate) fn ack_value(rev: i64) -> Vec<u8> {
    format!("handover taken={rev}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The handshake's keys and values are a wire format: a leader and a candidate in
    /// different processes (of different versions of this crate, in a rolling upgrade)
    /// must agree on them, and operators read them (docs/design/handover.md).
    #[test]
    fn the_handshake_is_written_beside_the_line_and_names_the_candidates_key() {
        assert_eq!(
            request_key(b"jobs", b"jobs/694d").as_deref(),
            Some(&b"jobs.handover/694d"[..])
        );
        assert_eq!(request_key(b"jobs", b"other/694d"), None);
        assert_eq!(request_key(b"jobs", b"jobs694d"), None);
        assert_eq!(request_value(42), b"handover to=42");
        assert_eq!(ack_value(42), b"handover taken=42");
        assert_ne!(request_value(42), request_value(43));
        assert_ne!(ack_value(42), ack_value(43));
    }
}
