//! Release requests: where anyone may ask the holder of a key under a name to let go, and
//! what the request says. The request for holder key `<name>/<rest>` is the key
//! `<name>.revoke/<rest>`, bound to the *holder's* lease: it is outside `<name>/`, so Go's
//! `Mutex`, `Election` and `etcdctl lock`/`elect` (which count every key under `<name>/`)
//! never see it, and it cannot outlive the session it was meant for. The holder's release
//! deletes it in the same Txn as its key, so a request leaves nothing behind once handled.
//!
//! The value is text, a field per line: `for=<create revision of the key asked>`,
//! `by=<who asked>`, and optionally `reason=<text>` (the rest of the value). A value that is
//! not in this form (an operator's `etcdctl put`) is still a request, with the whole text
//! as who asked: a request can only be read, never refused.

/// The suffix of a name under which its release requests are kept (`<name>.revoke/`).
const REQUESTS: &[u8] = b".revoke/";

/// Whether `prefix` (`<name>/`) is where the release requests of another name are kept
/// (`<other>.revoke/`): its keys mirror the holders' keys and leases, and are no line.
pub(crate) fn is_requests_prefix(prefix: &[u8]) -> bool {
    prefix.ends_with(REQUESTS)
}

/// The request key for `key`, a key under `<name>/`: `<name>.revoke/<the rest of key>`.
/// `None` if `key` is not under `<name>/`.
pub(crate) fn request_key(name: &[u8], key: &[u8]) -> Option<Vec<u8>> {
    beside(name, REQUESTS, key)
}

/// `<name><suffix><the rest of key>` for `key` under `<name>/` (a key kept beside a line
/// key, outside the line: release requests, hand-over requests); `None` if `key` is not
/// under `<name>/`.
pub(crate) fn beside(name: &[u8], suffix: &[u8], key: &[u8]) -> Option<Vec<u8>> {
    let rest = key.strip_prefix(name)?.strip_prefix(b"/")?;
    let mut beside = Vec::with_capacity(name.len() + suffix.len() + rest.len());
    beside.extend_from_slice(name);
    beside.extend_from_slice(suffix);
    beside.extend_from_slice(rest);
    Some(beside)
}

/// A request to let go of a held key, as its holder receives it from
/// [`Guard::release_requested`](crate::Guard::release_requested).
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
/// let guard = session.mutex("shard-7")?.lock()?;
/// if let Ok(request) = guard.release_requested().recv() {
///     println!("{} asked us to let go: {:?}", request.requester, request.reason);
///     guard.release()?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReleaseRequest {
    /// Who asked: the asking session's identity (`"<hostname>:<pid>"` unless set), or the
    /// whole value of a request written by hand.
    pub requester: String,
    /// Why, if the asker said.
    pub reason: Option<String>,
    /// The held key the request was for.
    pub key: Vec<u8>,
    /// The revision at which the request was written.
    pub revision: i64,
}

/// The value of a request for the key created at `target`.
pub(crate) fn encode(target: i64, requester: &str, reason: Option<&str>) -> Vec<u8> {
    let mut value = format!("for={target}\nby={requester}");
    if let Some(reason) = reason {
        value.push_str("\nreason=");
        value.push_str(reason);
    }
    value.into_bytes()
}

/// A request read from etcd: for the key created at `target` (`None`: for whichever hold
/// of the key is live, a request not written by this crate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decoded {
    pub(crate) target: Option<i64>,
    pub(crate) requester: String,
    pub(crate) reason: Option<String>,
}

/// Reads a request's value; never fails (see the module's comment).
pub(crate) fn decode(value: &[u8]) -> Decoded {
    let text = String::from_utf8_lossy(value);
    let by_hand = || Decoded {
        target: None,
        requester: text.trim().to_string(),
        reason: None,
    };
    let Some((first, rest)) = text.split_once('\n') else {
        return by_hand();
    };
    let Some(target) = first.strip_prefix("for=").and_then(|t| t.parse().ok()) else {
        return by_hand();
    };
    let (by, reason) = match rest.split_once('\n') {
        Some((by, reason)) => (by, reason.strip_prefix("reason=")),
        None => (rest, None),
    };
    let Some(requester) = by.strip_prefix("by=") else {
        return by_hand();
    };
    Decoded {
        target: Some(target),
        requester: requester.to_string(),
        reason: reason.map(str::to_string),
    }
}

impl ReleaseRequest {
    /// The request `decoded`, read from a put of the request key for `key` at `revision`,
    /// if it is for the hold of `key` created at `created`.
    pub(crate) fn of(decoded: Decoded, key: &[u8], created: i64, revision: i64) -> Option<Self> {
        if decoded.target.is_some_and(|target| target != created) {
            return None; // for an earlier hold of the same session's key
        }
        Some(ReleaseRequest {
            requester: decoded.requester,
            reason: decoded.reason,
            key: key.to_vec(),
            revision,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_key_is_beside_the_name_not_under_it() {
        assert_eq!(
            request_key(b"jobs", b"jobs/694d7e1a").as_deref(),
            Some(&b"jobs.revoke/694d7e1a"[..])
        );
        assert_eq!(
            request_key(b"a/b", b"a/b/1f.shared").as_deref(),
            Some(&b"a/b.revoke/1f.shared"[..])
        );
        assert!(
            !request_key(b"jobs", b"jobs/1")
                .unwrap_or_default()
                .starts_with(b"jobs/")
        );
        assert_eq!(request_key(b"jobs", b"jobsx/1"), None);
        assert_eq!(request_key(b"jobs", b"other/1"), None);
    }

    #[test]
    fn a_request_reads_back_as_written() {
        let with = decode(&encode(42, "host-a:17", Some("deploy\nof v2")));
        assert_eq!(
            with,
            Decoded {
                target: Some(42),
                requester: "host-a:17".into(),
                reason: Some("deploy\nof v2".into()),
            }
        );
        let without = decode(&encode(7, "b", None));
        assert_eq!(without.target, Some(7));
        assert_eq!(without.requester, "b");
        assert_eq!(without.reason, None);
    }

    #[test]
    fn any_other_value_is_a_request_by_its_text_for_the_live_hold() {
        for value in [
            &b"please let go"[..],
            b"for=x\nby=a",
            b"for=3\nwho=a",
            b"",
            b"\xff",
        ] {
            let decoded = decode(value);
            assert_eq!(decoded.target, None, "{value:?}");
            assert_eq!(decoded.reason, None);
            assert!(ReleaseRequest::of(decoded, b"k/1", 9, 10).is_some());
        }
        assert_eq!(decode(b"please let go\n").requester, "please let go");
    }

    #[test]
    fn a_request_for_an_earlier_hold_is_not_for_this_one() {
        let decoded = decode(&encode(5, "a", None));
        assert_eq!(ReleaseRequest::of(decoded.clone(), b"k/1", 6, 10), None);
        let request = ReleaseRequest::of(decoded, b"k/1", 5, 10);
        assert_eq!(request.map(|r| r.revision), Some(10));
    }
}
