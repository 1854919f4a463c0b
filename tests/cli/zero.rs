//! `--timeout 0s` tries once (issue 51): a free name runs the command; a held one gives up
//! at once, printing the limit as written.

use super::WAIT;
use super::common::{client, etcd, session};
use super::proc::{Proc, etcd_sync};

#[test]
fn a_zero_timeout_takes_a_free_lock_and_says_0s_on_a_held_one() {
    let server = etcd();
    let mut free = Proc::spawn(etcd_sync(
        &server,
        &[
            "lock",
            "--timeout",
            "0s",
            "zero",
            "--",
            "sh",
            "-c",
            "echo ran",
        ],
    ));
    assert_eq!(free.line(WAIT), "ran", "stderr: {}", free.stderr());
    assert_eq!(free.code(WAIT), 0, "stderr: {}", free.stderr());

    let c = client(&server.endpoints());
    let s = session(&c, 10);
    let _g = s.mutex("zero").unwrap().lock().unwrap();
    let mut held = Proc::spawn(etcd_sync(
        &server,
        &["lock", "--timeout", "0s", "zero", "--", "true"],
    ));
    assert_eq!(held.code(WAIT), 4, "stderr: {}", held.stderr());
    assert!(
        held.stderr().contains("after 0s (--timeout)"),
        "stderr: {}",
        held.stderr()
    );
}
