//! Which errors each predicate holds for, over one error of every variant.

use std::time::Duration;

use super::Error;
use super::code::Code;
use super::loss::LossReason;
use super::operation::Operation;

fn server(code: Code) -> Error {
    Error::Server {
        code,
        message: format!("etcdserver: {code:?}"),
    }
}

/// A request the member did not answer in time.
fn slow_request() -> Error {
    Error::Timeout {
        operation: Operation::Request,
        after: Duration::from_secs(5),
        endpoint: Some("http://127.0.0.1:2379".into()),
    }
}

/// A `lock_timeout` limit that ran out.
fn lock_wait_ran_out() -> Error {
    Error::wait_timeout(Operation::Lock, Duration::from_secs(1))
}

/// One error of every variant (and a `Server` error of every code).
fn every_error() -> Vec<Error> {
    let mut errors = vec![
        Error::Connect {
            endpoints: "http://127.0.0.1:2379".into(),
            reason: "connection refused".into(),
        },
        Error::ClientCertificateRejected {
            endpoint: "https://127.0.0.1:2379".into(),
            detail: "TLS alert CertificateRequired".into(),
        },
        slow_request(),
        lock_wait_ran_out(),
        Error::unavailable("etcdserver: no leader"),
        Error::SessionLost(LossReason::Expired),
        Error::LockLost,
        Error::NotLeader,
        Error::WouldDeadlock("m".into()),
        Error::InvalidArgument("empty key".into()),
        Error::InsideAsyncRuntime,
        Error::Authentication("etcdserver: authentication failed".into()),
        Error::Closed,
        Error::Conflict { attempts: 3 },
        a_deadlock(),
        Error::HandOverFailed {
            to: "e/694d".into(),
            reason: "not waiting".into(),
        },
    ];
    errors.extend(
        [
            Code::Ok,
            Code::Cancelled,
            Code::Unknown,
            Code::InvalidArgument,
            Code::DeadlineExceeded,
            Code::NotFound,
            Code::AlreadyExists,
            Code::PermissionDenied,
            Code::ResourceExhausted,
            Code::FailedPrecondition,
            Code::Aborted,
            Code::OutOfRange,
            Code::Unimplemented,
            Code::Internal,
            Code::Unavailable,
            Code::DataLoss,
            Code::Unauthenticated,
        ]
        .into_iter()
        .map(server),
    );
    errors
}

/// Two sessions waiting for each other, as a wait's `Deadlock` names them.
fn a_deadlock() -> Error {
    use super::cycle::{Cycle, CycleStep};
    let step = |lease, name: &str, holder| CycleStep {
        lease,
        name: name.as_bytes().to_vec(),
        holder,
        identity: Some(format!("host-{lease}")),
    };
    Error::Deadlock {
        cycle: Cycle {
            steps: vec![step(1, "x", 2), step(2, "y", 1)],
        },
        revision: 9,
    }
}

/// The errors for which `predicate` holds, by their `Debug` text.
fn which(predicate: fn(&Error) -> bool) -> Vec<String> {
    every_error()
        .iter()
        .filter(|e| predicate(e))
        .map(|e| format!("{e:?}"))
        .collect()
}

fn debug(errors: &[Error]) -> Vec<String> {
    errors.iter().map(|e| format!("{e:?}")).collect()
}

#[test]
fn retryable_means_unreachable_busy_or_slow() {
    assert_eq!(
        which(Error::is_retryable),
        debug(&[
            slow_request(),
            lock_wait_ran_out(),
            Error::unavailable("etcdserver: no leader"),
            server(Code::DeadlineExceeded),
            server(Code::ResourceExhausted),
            server(Code::Aborted),
            server(Code::Unavailable),
        ])
    );
}

#[test]
fn transient_keeps_its_narrower_meaning() {
    // The crate's own retry loops never repeat a request etcd answered.
    assert_eq!(
        which(Error::is_transient),
        debug(&[
            slow_request(),
            lock_wait_ran_out(),
            Error::unavailable("etcdserver: no leader"),
        ])
    );
    for e in every_error() {
        assert!(!e.is_transient() || e.is_retryable(), "{e:?}");
    }
}

#[test]
fn conflict_is_only_a_transaction_giving_up() {
    assert_eq!(
        which(Error::is_conflict),
        debug(&[Error::Conflict { attempts: 3 }])
    );
}

#[test]
fn deadlock_is_only_a_wait_that_closed_a_cycle() {
    assert_eq!(which(Error::is_deadlock), debug(&[a_deadlock()]));
    let e = a_deadlock();
    let cycle = e.deadlock_cycle().map(|c| c.leases().collect::<Vec<_>>());
    assert_eq!(cycle, Some(vec![1, 2]));
    assert_eq!(
        e.to_string(),
        "deadlock: this wait would complete a cycle of waits (as of revision 9: 1 (host-1) \
         waits for x held by 2; 2 (host-2) waits for y held by 1); it was ended and its key \
         removed so that the others can go on"
    );
    assert!(
        every_error()
            .iter()
            .all(|e| e.deadlock_cycle().is_some() == e.is_deadlock())
    );
}

#[test]
fn timeout_is_ours_or_etcds() {
    assert_eq!(
        which(Error::is_timeout),
        debug(&[
            slow_request(),
            lock_wait_ran_out(),
            server(Code::DeadlineExceeded),
        ])
    );
}

#[test]
fn wait_timeout_is_only_a_wait_running_out() {
    assert_eq!(which(Error::is_wait_timeout), debug(&[lock_wait_ran_out()]));
    for operation in Operation::ALL.into_iter().filter(|o| o.is_wait()) {
        let e = Error::wait_timeout(operation, Duration::from_secs(1));
        assert!(e.is_wait_timeout() && e.is_timeout() && e.endpoint().is_none());
        assert!(e.is_retryable(), "a busy lock may be free later: {e:?}");
    }
    for operation in Operation::ALL.into_iter().filter(|o| !o.is_wait()) {
        let e = Error::Timeout {
            operation,
            after: Duration::from_secs(5),
            endpoint: None,
        };
        assert!(!e.is_wait_timeout() && e.is_timeout(), "{e:?}");
    }
}

#[test]
fn transport_errors_name_their_endpoint() {
    let e = Error::Unavailable {
        endpoint: Some("http://127.0.0.1:2379".into()),
        reason: "tcp connect error: Connection refused (os error 111)".into(),
        source: None,
    };
    assert_eq!(
        e.to_string(),
        "etcd unavailable at http://127.0.0.1:2379: tcp connect error: \
         Connection refused (os error 111)"
    );
    let slow = Error::Timeout {
        operation: Operation::Request,
        after: Duration::from_secs(5),
        endpoint: Some("http://127.0.0.1:2379".into()),
    };
    assert_eq!(
        slow.to_string(),
        "etcd request timed out after 5s at http://127.0.0.1:2379"
    );
    assert_eq!(slow.endpoint(), Some("http://127.0.0.1:2379"));
}

#[test]
fn session_lost_and_its_reason() {
    assert_eq!(
        which(Error::is_session_lost),
        debug(&[Error::SessionLost(LossReason::Expired)])
    );
    for reason in [
        LossReason::Closed,
        LossReason::Orphaned,
        LossReason::Revoked,
        LossReason::Expired,
        LossReason::ClientClosed,
    ] {
        let e = Error::SessionLost(reason.clone());
        assert!(e.is_session_lost() && e.is_lost());
        assert_eq!(e.loss_reason(), Some(&reason));
    }
    for e in every_error() {
        assert_eq!(e.loss_reason().is_some(), e.is_session_lost(), "{e:?}");
    }
}

#[test]
fn lost_is_lock_leadership_or_session() {
    assert_eq!(
        which(Error::is_lost),
        debug(&[
            Error::SessionLost(LossReason::Expired),
            Error::LockLost,
            Error::NotLeader,
        ])
    );
}

#[test]
fn connect_is_only_about_connecting() {
    assert_eq!(
        which(Error::is_connect),
        debug(&[
            Error::Connect {
                endpoints: "http://127.0.0.1:2379".into(),
                reason: "connection refused".into(),
            },
            Error::ClientCertificateRejected {
                endpoint: "https://127.0.0.1:2379".into(),
                detail: "TLS alert CertificateRequired".into(),
            },
        ])
    );
}

#[test]
fn invalid_argument_is_ours_or_etcds() {
    assert_eq!(
        which(Error::is_invalid_argument),
        debug(&[
            Error::InvalidArgument("empty key".into()),
            server(Code::InvalidArgument),
        ])
    );
}

#[test]
fn a_request_too_large_for_grpc_is_not_retryable() {
    // What etcd's gRPC server answers for a message above --max-request-bytes + 512 KiB
    // (seen with a 2.6 MB put against etcd 3.4's defaults).
    let huge = Error::Server {
        code: Code::ResourceExhausted,
        message: "grpc: received message larger than max (2600008 vs. 2097152)".into(),
    };
    assert!(!huge.is_retryable());
    assert!(huge.is_invalid_argument());
    let busy = Error::Server {
        code: Code::ResourceExhausted,
        message: "etcdserver: too many requests".into(),
    };
    assert!(busy.is_retryable());
    assert!(!busy.is_invalid_argument());
}

#[test]
fn no_error_is_both_lost_and_retryable() {
    // A program that retries retryable errors never retries a loss.
    for e in every_error() {
        assert!(!(e.is_lost() && e.is_retryable()), "{e:?}");
        assert!(!(e.is_invalid_argument() && e.is_retryable()), "{e:?}");
    }
}

#[test]
fn operations_print_the_words_of_the_error_messages() {
    // The messages read as before `Operation` replaced the `&'static str`.
    let words: Vec<(Operation, &str)> = Operation::ALL
        .into_iter()
        .map(|o| (o, o.as_str()))
        .collect();
    assert_eq!(
        words,
        [
            (Operation::Request, "etcd request"),
            (Operation::OpenWatch, "opening a watch"),
            (
                Operation::Release,
                "release (still retried in the background)"
            ),
            (Operation::Lock, "lock"),
            (Operation::Read, "read"),
            (Operation::Write, "write"),
            (Operation::Acquire, "acquire"),
            (Operation::Campaign, "campaign"),
            (Operation::Observe, "observe"),
            (Operation::Barrier, "barrier wait"),
            (Operation::Enter, "enter"),
            (Operation::Leave, "leave"),
            (Operation::Latch, "latch wait"),
        ]
    );
    for operation in Operation::ALL {
        assert_eq!(operation.to_string(), operation.as_str());
    }
    let e = Error::wait_timeout(Operation::Campaign, Duration::from_millis(1500));
    assert_eq!(e.to_string(), "campaign timed out after 1.5s");
}

#[test]
fn acquisitions_are_the_waits_that_take_something() {
    let acquisitions: Vec<Operation> = Operation::ALL
        .into_iter()
        .filter(|o| o.is_acquisition())
        .collect();
    assert_eq!(
        acquisitions,
        [
            Operation::Lock,
            Operation::Read,
            Operation::Write,
            Operation::Acquire,
            Operation::Campaign,
            Operation::Enter,
        ]
    );
}
