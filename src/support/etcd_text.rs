//! The texts of etcd's answers that mean something we act on.
//!
//! etcd's gRPC codes are too coarse to act on: "no leader", "rpc not supported for
//! learner" and a dropped connection are all `Unavailable`, and some answers (watch cancel
//! reasons) carry no code at all. Where the code does not decide, we match the message;
//! every text is here, so a server version that words one differently is fixed in one
//! place. Each is the text of etcd's own error (`rpctypes.ErrGRPC*`, `lease.ErrLeaseNotFound`)
//! and is the same in etcd 3.4 to 3.7 (the code is not: 3.7 refuses a learner's call
//! with `FailedPrecondition`): the suite runs on each (`scripts/test`), and the
//! tests that provoke each answer (learner, auth expiry, revoked lease, leaderless member)
//! fail if a version stops matching.

/// A learner (non-voting member) refused the call before doing anything with it (code
/// `Unavailable` up to etcd 3.6, `FailedPrecondition` from 3.7: the text decides).
pub(crate) const NOT_SUPPORTED_FOR_LEARNER: &str = "rpc not supported for learner";
/// The member has no raft leader. With `hasleader` metadata the check comes before the
/// request is handled, so nothing was applied.
pub(crate) const NO_LEADER: &str = "etcdserver: no leader";
/// The auth token is unknown to the member (expired, or issued by a restarted member).
pub(crate) const INVALID_AUTH_TOKEN: &str = "invalid auth token";
/// The token predates a change to users or roles.
pub(crate) const AUTH_REVISION_OLD: &str = "revision of auth store is old";
/// A call without a token reached a server with auth enabled.
pub(crate) const USER_NAME_EMPTY: &str = "user name is empty";
/// The call's role may not touch the key.
pub(crate) const PERMISSION_DENIED: &str = "permission denied";
/// The lease the request names no longer exists on the server.
pub(crate) const LEASE_NOT_FOUND: &str = "lease not found";
/// gRPC (not etcd) refused a message above its size limit.
pub(crate) const GRPC_TOO_LARGE: &str = "larger than max";
/// A read at a revision that compaction has removed (code `OutOfRange`).
pub(crate) const COMPACTED: &str = "required revision has been compacted";
/// A read at a revision the member has not applied yet (code `OutOfRange`): a serializable
/// read on a member behind the one that answered before.
pub(crate) const FUTURE_REVISION: &str = "required revision is a future revision";

/// Whether etcd refused the call before handling it, so sending it to another member
/// cannot apply it twice, whatever the call is.
pub(crate) fn is_refused_unhandled(message: &str) -> bool {
    message.contains(NOT_SUPPORTED_FOR_LEARNER) || message.contains(NO_LEADER)
}

/// Whether etcd refused the call's auth token (authenticating again may succeed).
pub(crate) fn is_stale_token(message: &str) -> bool {
    message.contains(INVALID_AUTH_TOKEN)
        || message.contains(AUTH_REVISION_OLD)
        || message.contains(USER_NAME_EMPTY)
}

/// Whether etcd refused a read at a past revision because it was compacted.
pub(crate) fn is_compacted(message: &str) -> bool {
    message.contains(COMPACTED)
}

/// Whether the member refused a read at a revision it has not reached yet.
pub(crate) fn is_future_revision(message: &str) -> bool {
    message.contains(FUTURE_REVISION)
}

/// Whether a member of this version (`StatusResponse.version`, "3.5.15") serves a watcher
/// that starts at exactly the compact revision the delete events at that revision (etcd
/// #18089, fixed in 3.4.34, 3.5.15 and 3.6.0). An unknown or unreadable version is taken
/// for one without the fix: that costs only speed (see `transport/watches/watcher.rs`).
pub(crate) fn keeps_compacted_deletes(version: &str) -> bool {
    let mut parts = version
        .split(['.', '-', '+'])
        .map(|part| part.parse::<u32>().ok());
    let (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) =
        (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    match (major, minor) {
        (3, 0..=3) => false,
        (3, 4) => patch >= 34,
        (3, 5) => patch >= 15,
        (3, _) => true,
        (major, _) => major > 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_releases_with_the_compacted_delete_fix_are_told_apart() {
        for fixed in [
            "3.4.34", "3.4.45", "3.5.15", "3.5.34", "3.6.0", "3.7.2", "4.0.0",
        ] {
            assert!(keeps_compacted_deletes(fixed), "{fixed}");
        }
        for unfixed in [
            "3.4.23", "3.4.33", "3.5.1", "3.5.14", "3.3.27", "", "3.5", "x.y.z",
        ] {
            assert!(!keeps_compacted_deletes(unfixed), "{unfixed}");
        }
        // Suffixes (a build tag, the simulation's) do not hide the release.
        assert!(keeps_compacted_deletes("3.5.15-sim"));
        assert!(!keeps_compacted_deletes("3.4.33-sim"));
    }

    #[test]
    fn refusals_before_handling_are_told_apart_from_ambiguous_failures() {
        assert!(is_refused_unhandled(
            "etcdserver: rpc not supported for learner"
        ));
        assert!(is_refused_unhandled("etcdserver: no leader"));
        assert!(!is_refused_unhandled("etcdserver: request timed out"));
        assert!(!is_refused_unhandled(
            "etcdserver: request timed out, possibly due to previous leader failure"
        ));
        assert!(is_stale_token("etcdserver: invalid auth token"));
        assert!(is_stale_token("etcdserver: revision of auth store is old"));
        assert!(!is_stale_token("etcdserver: permission denied"));
        assert!(is_compacted(
            "etcdserver: mvcc: required revision has been compacted"
        ));
        assert!(!is_compacted(
            "etcdserver: mvcc: required revision is a future revision"
        ));
    }
}
