//! Software transactions (`Client::stm`, `StmBuilder`) against a real etcd: commits,
//! conflicts and retries at each isolation level, the retry bound, errors passing through,
//! and interop with Go's `concurrency.NewSTM` on the same keys.

#![cfg(feature = "testing")]

mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::{child_lines, client, etcd, handled};
use etcd_sync::{Client, Error, Isolation, StmTx};

const ALL_LEVELS: [Isolation; 4] = [
    Isolation::SerializableSnapshot,
    Isolation::Serializable,
    Isolation::RepeatableReads,
    Isolation::ReadCommitted,
];

fn text(v: Option<Vec<u8>>) -> Option<String> {
    v.map(|v| String::from_utf8(v).expect("utf-8 value"))
}

fn value(c: &Client, key: &str) -> Option<String> {
    c.get(key)
        .expect("read")
        .map(|kv| kv.value_str().into_owned())
}

fn number(tx: &mut StmTx<'_>, key: &str) -> etcd_sync::Result<u64> {
    Ok(text(tx.get(key)?).map_or(0, |v| v.parse().expect("a number")))
}

#[test]
fn a_commit_applies_every_write_at_one_revision() {
    let server = etcd();
    let c = client(&server.endpoints());
    c.put("a", "1").unwrap();
    c.put("gone", "x").unwrap();
    let returned = c
        .stm(|tx| {
            let a = number(tx, "a")?;
            tx.put("b", (a + 1).to_string());
            tx.put("c", "new");
            tx.delete("gone");
            // Our own writes read back inside the transaction.
            assert_eq!(text(tx.get("b")?).as_deref(), Some("2"));
            assert_eq!(tx.get("gone")?, None);
            Ok::<_, Error>(a * 10)
        })
        .unwrap();
    assert_eq!(returned, 10);
    assert_eq!(value(&c, "a").as_deref(), Some("1"));
    assert_eq!(value(&c, "b").as_deref(), Some("2"));
    assert_eq!(value(&c, "c").as_deref(), Some("new"));
    assert_eq!(value(&c, "gone"), None);
    let (b, cc) = (c.get("b").unwrap().unwrap(), c.get("c").unwrap().unwrap());
    assert_eq!(b.mod_revision, cc.mod_revision, "one Txn");
}

/// `threads` clients increment one counter `per_thread` times each, in transactions that
/// pause between their read and their write so that they overlap; returns the counter and
/// how many attempts ran in all.
fn contended_increments(
    endpoints: &[String],
    key: &str,
    isolation: Isolation,
    threads: usize,
    per_thread: u64,
) -> (u64, u64) {
    let start = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (endpoints, start, key) = (endpoints.to_vec(), start.clone(), key.to_string());
            std::thread::spawn(move || {
                let c = client(&endpoints);
                let stm = c.stm_builder().isolation(isolation);
                let mut attempts = 0;
                start.wait();
                for _ in 0..per_thread {
                    stm.run(|tx| {
                        attempts += 1;
                        let n = number(tx, &key)?;
                        std::thread::sleep(Duration::from_millis(1));
                        tx.put(&key, (n + 1).to_string());
                        Ok::<_, Error>(())
                    })
                    .expect("an unbounded transaction commits");
                }
                attempts
            })
        })
        .collect();
    let attempts = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let c = client(endpoints);
    let total = value(&c, key).map_or(0, |v| v.parse().unwrap());
    (total, attempts)
}

#[test]
fn concurrent_increments_add_up_exactly_at_each_checking_level() {
    let server = etcd();
    // Read committed checks nothing at commit: lost updates are its documented behaviour,
    // so only the three other levels promise an exact count.
    for isolation in [
        Isolation::SerializableSnapshot,
        Isolation::Serializable,
        Isolation::RepeatableReads,
    ] {
        let key = format!("counter/{isolation:?}");
        let (total, attempts) = contended_increments(&server.endpoints(), &key, isolation, 4, 20);
        assert_eq!(total, 80, "{isolation:?}: lost or doubled increments");
        assert!(
            attempts > 80,
            "{isolation:?}: overlapping transactions never conflicted ({attempts} attempts), \
             so this run proved nothing"
        );
    }
}

/// Runs a transaction that reads "a" then writes "b" = that value, while another client
/// changes "a" during the first attempt; returns b and how many attempts ran.
fn copy_while_the_source_changes(
    c: &Client,
    other: &Client,
    isolation: Isolation,
) -> (String, u32) {
    c.put("a", "old").unwrap();
    c.delete("b").unwrap();
    let mut attempts = 0;
    c.stm_builder()
        .isolation(isolation)
        .run(|tx| {
            attempts += 1;
            let a = tx.get("a")?.unwrap_or_default();
            if tx.attempt() == 0 {
                other.put("a", "new").unwrap();
                // Read again: every level answers a key once per attempt.
                assert_eq!(tx.get("a")?.as_ref(), Some(&a));
            }
            tx.put("b", a);
            Ok::<_, Error>(())
        })
        .unwrap();
    (value(c, "b").unwrap(), attempts)
}

#[test]
fn read_committed_commits_over_a_changed_read_and_the_other_levels_retry() {
    let server = etcd();
    let c = client(&server.endpoints());
    let other = client(&server.endpoints());
    for isolation in ALL_LEVELS {
        let got = copy_while_the_source_changes(&c, &other, isolation);
        let want = match isolation {
            Isolation::ReadCommitted => ("old".to_string(), 1),
            _ => ("new".to_string(), 2),
        };
        assert_eq!(got, want, "{isolation:?}");
    }
}

#[test]
fn serializable_levels_read_one_snapshot_and_the_others_the_newest_value() {
    let server = etcd();
    let c = client(&server.endpoints());
    let other = client(&server.endpoints());
    for isolation in ALL_LEVELS {
        c.put("x", "1").unwrap();
        c.put("y", "1").unwrap();
        let mut seen = Vec::new();
        c.stm_builder()
            .isolation(isolation)
            .run(|tx| {
                let x = text(tx.get("x")?).unwrap();
                if tx.attempt() == 0 {
                    other.put("y", "2").unwrap();
                }
                let y = text(tx.get("y")?).unwrap();
                seen.push(format!("{x}{y}"));
                Ok::<_, Error>(())
            })
            .unwrap();
        let want: &[&str] = match isolation {
            // The snapshot is the first read's revision: y as it was then; the commit
            // then finds y changed and the second attempt sees it.
            Isolation::SerializableSnapshot | Isolation::Serializable => &["11", "12"],
            Isolation::RepeatableReads | Isolation::ReadCommitted => &["12"],
        };
        assert_eq!(seen, want, "{isolation:?}");
    }
}

#[test]
fn serializable_snapshot_also_conflicts_on_a_key_written_since_its_snapshot() {
    let server = etcd();
    let c = client(&server.endpoints());
    let other = client(&server.endpoints());
    for isolation in [Isolation::SerializableSnapshot, Isolation::Serializable] {
        c.put("r", "read").unwrap();
        let mut attempts = 0;
        c.stm_builder()
            .isolation(isolation)
            .run(|tx| {
                attempts += 1;
                tx.get("r")?;
                if tx.attempt() == 0 {
                    other.put("w", "theirs").unwrap();
                }
                tx.put("w", "ours"); // a blind write: "w" was not read
                Ok::<_, Error>(())
            })
            .unwrap();
        let want = if isolation == Isolation::SerializableSnapshot {
            2
        } else {
            1
        };
        assert_eq!(attempts, want, "{isolation:?}");
        assert_eq!(value(&c, "w").as_deref(), Some("ours"));
    }
}

#[test]
fn the_retry_bound_ends_in_a_conflict_error_with_nothing_committed() {
    let server = etcd();
    let c = client(&server.endpoints());
    let other = client(&server.endpoints());
    c.put("busy", "0").unwrap();
    for (bound, attempts) in [(0, 1), (2, 3)] {
        let mut ran = 0;
        let err = c
            .stm_builder()
            .max_retries(bound)
            .run(|tx| {
                ran += 1;
                let n = number(tx, "busy")?;
                other.put("busy", (n + 100).to_string()).unwrap(); // always in the way
                tx.put("busy", "mine");
                tx.put("also", "mine");
                Ok::<_, Error>(())
            })
            .unwrap_err();
        assert!(err.is_conflict(), "{err:?}");
        assert!(!err.is_retryable(), "{err:?}");
        assert!(
            matches!(err, Error::Conflict { attempts: a } if a == attempts),
            "{err:?}"
        );
        assert!(err.to_string().contains("nothing was committed"), "{err}");
        assert_eq!(ran, attempts);
        assert_ne!(value(&c, "busy").as_deref(), Some("mine"));
        assert_eq!(value(&c, "also"), None);
    }
}

#[derive(Debug, PartialEq)]
enum AppError {
    Etcd(String),
    Refused(u64),
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Etcd(e.to_string())
    }
}

#[test]
fn a_user_error_passes_through_at_once_and_commits_nothing() {
    let server = etcd();
    let c = client(&server.endpoints());
    c.put("stock", "3").unwrap();
    let mut ran = 0;
    let outcome: Result<(), AppError> = c.stm_builder().run(|tx| {
        ran += 1;
        let n = number(tx, "stock")?;
        tx.put("stock", "0");
        tx.put("order", "placed");
        Err(AppError::Refused(n))
    });
    assert_eq!(outcome, Err(AppError::Refused(3)));
    assert_eq!(ran, 1, "a user error is not retried");
    assert_eq!(value(&c, "stock").as_deref(), Some("3"));
    assert_eq!(value(&c, "order"), None);
}

#[test]
fn deletes_apply_and_read_as_absent_inside_the_transaction() {
    let server = etcd();
    let c = client(&server.endpoints());
    c.put("d1", "x").unwrap();
    c.put("d2", "x").unwrap();
    c.stm(|tx| {
        assert_eq!(text(tx.get("d1")?).as_deref(), Some("x"));
        tx.delete("d1");
        assert_eq!(tx.get("d1")?, None);
        assert!(
            tx.rev("d1")? > 0,
            "rev is etcd's, not the buffered delete's"
        );
        tx.put("d2", "y");
        tx.delete("d2"); // the last write of a key wins
        tx.delete("never-existed");
        tx.put("d3", "z");
        Ok::<_, Error>(())
    })
    .unwrap();
    assert_eq!(value(&c, "d1"), None);
    assert_eq!(value(&c, "d2"), None);
    assert_eq!(value(&c, "d3").as_deref(), Some("z"));
}

#[test]
fn a_missing_key_reads_as_none_and_its_creation_is_a_conflict() {
    let server = etcd();
    let c = client(&server.endpoints());
    let other = client(&server.endpoints());
    let mut seen = Vec::new();
    c.stm(|tx| {
        let v = text(tx.get("missing")?);
        let rev = tx.rev("missing")?;
        seen.push((v.clone(), rev > 0));
        if tx.attempt() == 0 {
            assert_eq!(rev, 0);
            other.put("missing", "created").unwrap();
        }
        tx.put("copy", v.unwrap_or_else(|| "none".into()));
        Ok::<_, Error>(())
    })
    .unwrap();
    assert_eq!(seen, [(None, false), (Some("created".into()), true)]);
    assert_eq!(value(&c, "copy").as_deref(), Some("created"));
}

#[test]
fn bad_input_and_ignored_read_errors_end_the_transaction_uncommitted() {
    let server = etcd();
    let c = client(&server.endpoints());
    // A read error the closure swallows still aborts, as Go's Get does.
    let err = c
        .stm(|tx| {
            let _ = tx.get("");
            tx.put("k1", "v");
            Ok::<_, Error>(())
        })
        .unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
    // Empty keys in writes are refused when the closure returns.
    for write in [
        (|tx: &mut StmTx<'_>| tx.put("", "v")) as fn(&mut StmTx<'_>),
        |tx| tx.delete(""),
    ] {
        let err = c
            .stm(|tx| {
                tx.put("k2", "v");
                write(tx);
                Ok::<_, Error>(())
            })
            .unwrap_err();
        assert!(
            err.is_invalid_argument() && err.to_string().contains("empty key"),
            "{err:?}"
        );
    }
    let err = c
        .stm_builder()
        .prefetch(["ok", ""])
        .run(|_| Ok::<_, Error>(()))
        .unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
    assert_eq!(value(&c, "k1"), None);
    assert_eq!(value(&c, "k2"), None);
}

#[test]
fn prefetch_and_a_conflict_retry_read_without_a_range_each() {
    let server = etcd();
    let c = client(&server.endpoints());
    let other = client(&server.endpoints());
    for k in ["p1", "p2", "p3"] {
        c.put(k, "1").unwrap();
    }
    let count = |method| handled(&server.metrics().expect("etcd's /metrics"), method);
    let (range0, txn0) = (count("Range"), count("Txn"));
    let mut attempts = 0;
    c.stm_builder()
        .prefetch(["p1", "p2", "p3"])
        .run(|tx| {
            attempts += 1;
            let sum = number(tx, "p1")? + number(tx, "p2")? + number(tx, "p3")?;
            if tx.attempt() == 0 {
                other.put("p2", "5").unwrap(); // one Put, not a Range or Txn
            }
            tx.put("sum", sum.to_string());
            Ok::<_, Error>(())
        })
        .unwrap();
    let (ranges, txns) = (count("Range") - range0, count("Txn") - txn0);
    assert_eq!(attempts, 2);
    assert_eq!(value(&c, "sum").as_deref(), Some("7"));
    // One Txn of reads (the prefetch), the failed commit (whose else branch read the keys
    // again for the retry), the retry's commit; no Range at all.
    assert_eq!((ranges, txns), (0, 3));
}

#[test]
fn a_snapshot_compacted_away_starts_the_attempt_again() {
    let server = etcd();
    let c = client(&server.endpoints());
    c.put("s1", "1").unwrap();
    c.put("s2", "2").unwrap();
    let mut attempts = 0;
    let sum = c
        .stm(|tx| {
            attempts += 1;
            let s1 = number(tx, "s1")?;
            if tx.attempt() == 0 {
                let rev = c.put("elsewhere", "x").unwrap();
                c.compact(rev).unwrap(); // the snapshot (s1's read) is gone
            }
            let s2 = number(tx, "s2")?; // compacted on attempt 0: Err, passed up by `?`
            tx.put("s3", (s1 + s2).to_string());
            Ok::<_, Error>(s1 + s2)
        })
        .unwrap();
    assert_eq!((sum, attempts), (3, 2));
    assert_eq!(value(&c, "s3").as_deref(), Some("3"));
}

/// A scratch directory, removed when dropped, pass or fail.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The Go program of the interop test, built from tests/stm_go with Debian's etcd 3.4 Go
/// sources (offline, GOPATH mode) into a scratch directory; panics, saying what to
/// install, when Go is missing.
fn build_go_stm() -> (Scratch, std::path::PathBuf) {
    const GOCODE: &str = "/usr/share/gocode";
    let go_ok = std::process::Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    let sources = std::path::Path::new(GOCODE).join("src/go.etcd.io/etcd/clientv3/concurrency");
    assert!(
        go_ok && sources.is_dir(),
        "the STM interop test needs the Go toolchain and etcd's Go sources in {GOCODE} \
         (apt-get install golang-go golang-etcd-server-dev): go found: {go_ok}, sources \
         found: {}",
        sources.is_dir()
    );
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("stm-go-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("gopath")).expect("scratch directory");
    let dir = Scratch(dir);
    let dir_path = &dir.0;
    let binary = dir_path.join("stminterop");
    let out = std::process::Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg(".")
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/stm_go"))
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env(
            "GOPATH",
            format!("{}:{GOCODE}", dir_path.join("gopath").display()),
        )
        .output()
        .expect("run go build");
    assert!(
        out.status.success(),
        "go build of tests/stm_go failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (dir, binary)
}

#[test]
fn go_and_rust_transactions_on_one_counter_add_up_exactly() {
    let (_scratch, go) = build_go_stm();
    let server = etcd();
    let endpoints = server.endpoints();
    let mut child = common::ChildGuard::spawn({
        let mut cmd = std::process::Command::new(&go);
        cmd.args([
            "-endpoints",
            &endpoints.join(","),
            "-key",
            "shared",
            "-n",
            "40",
        ])
        .args(["-workers", "2", "-iso", "serializable-snapshot"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
        cmd
    });
    let lines = child_lines(child.child()).expect("the Go program's stdout");
    let ready = lines.recv_timeout(Duration::from_secs(30));
    assert_eq!(
        ready.as_deref(),
        Ok("ready"),
        "the Go program did not start"
    );
    // Go's two workers and ours (one at each level that checks its reads) start together.
    {
        use std::io::Write;
        let mut stdin = child.child().stdin.take().expect("stdin");
        stdin.write_all(b"go\n").expect("start the Go workers");
    }
    let ours: Vec<_> = [Isolation::SerializableSnapshot, Isolation::RepeatableReads]
        .into_iter()
        .map(|isolation| {
            let endpoints = endpoints.clone();
            std::thread::spawn(move || {
                let c = client(&endpoints);
                let stm = c.stm_builder().isolation(isolation);
                let mut attempts = 0u64;
                for _ in 0..40 {
                    stm.run(|tx| {
                        attempts += 1;
                        let n = number(tx, "shared")?;
                        tx.put("shared", (n + 1).to_string());
                        Ok::<_, Error>(())
                    })
                    .expect("commit");
                }
                attempts
            })
        })
        .collect();
    let ours: u64 = ours.into_iter().map(|t| t.join().unwrap()).sum();
    let done = lines.recv_timeout(Duration::from_secs(60));
    let done = done.expect("the Go program's result");
    assert!(done.starts_with("done commits=80 "), "Go: {done}");
    let status = child.take().wait().expect("the Go program's exit");
    assert!(status.success(), "Go exited with {status}");
    let c = client(&endpoints);
    assert_eq!(value(&c, "shared").as_deref(), Some("160"), "Go: {done}");
    let go: u64 = done
        .rsplit("attempts=")
        .next()
        .and_then(|n| n.parse().ok())
        .expect("Go's attempts");
    assert!(
        ours + go > 160,
        "no transaction conflicted ({ours} attempts here, {go} in Go), so the two sides \
         never overlapped and this run proved nothing"
    );
}

/// A read-modify-write of 128 keys commits at every level: under the serializable
/// snapshot, a key read and written costs one compare, not two (etcd refuses more than 128
/// in a Txn: 65 keys failed with "too many operations in txn request"); 129 keys are
/// refused with that error, and nothing is written.
#[test]
fn a_read_modify_write_of_128_keys_fits_one_txn_at_every_level() {
    let server = etcd();
    let c = client(&server.endpoints());
    for level in ALL_LEVELS {
        c.stm_builder()
            .isolation(level)
            .run(|tx| {
                for i in 0..128 {
                    let key = format!("many/{i}");
                    let n = number(tx, &key)?;
                    tx.put(&key, (n + 1).to_string());
                }
                Ok::<_, Error>(())
            })
            .unwrap_or_else(|e| panic!("{level:?}: {e}"));
    }
    for i in 0..128 {
        assert_eq!(value(&c, &format!("many/{i}")).as_deref(), Some("4"));
    }
    let err = c
        .stm(|tx| {
            for i in 0..129 {
                let key = format!("many/{i}");
                let n = number(tx, &key)?;
                tx.put(&key, (n + 1).to_string());
            }
            Ok::<_, Error>(())
        })
        .unwrap_err();
    assert!(err.to_string().contains("too many operations"), "{err}");
    assert_eq!(value(&c, "many/0").as_deref(), Some("4"));
}
