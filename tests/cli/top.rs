//! `etcd-sync top [PREFIX]`: `--json` prints the wait graph once (a deadlock between two
//! sessions as a cycle naming both), and the live view, run in a real terminal (tmux) as
//! a person would, shows the holder and the waiter, then a deadlock as it forms and ends,
//! and quits on `q`.

use std::process::Command;
use std::time::Duration;

use crate::WAIT;
use crate::common::{client, etcd, eventually, keys};
use crate::proc::etcd_sync;

use etcd_sync::{Client, Session};

fn named(c: &Client, identity: &str) -> Session {
    c.session_builder()
        .ttl(Duration::from_secs(10))
        .identity(identity)
        .start()
        .expect("start a session")
}

#[test]
fn top_json_prints_the_graph_and_the_cycle_once() {
    let server = etcd();
    let c = client(&server.endpoints());
    let (a, b) = (named(&c, "proc-a"), named(&c, "proc-b"));
    let x = a.mutex("t/x").unwrap().lock().unwrap();
    let y = b.mutex("t/y").unwrap().lock().unwrap();
    let waits: Vec<_> = [(&a, "t/y"), (&b, "t/x")]
        .into_iter()
        .map(|(s, name)| {
            let m = s.mutex(name).unwrap();
            std::thread::spawn(move || m.lock_timeout(Duration::from_secs(60)).map(drop))
        })
        .collect();
    assert!(eventually(WAIT, || keys(&c, "t/").len() == 4));

    let out = etcd_sync(&server, &["top", "--json", "t/"])
        .output()
        .expect("run etcd-sync top --json");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let graph: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(graph["prefix"], "t/");
    let names: Vec<&str> = graph["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["t/x", "t/y"]);
    let (ha, hb) = (format!("{:x}", a.lease_id()), format!("{:x}", b.lease_id()));
    let sessions = graph["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 2, "{stdout}");
    for s in sessions {
        assert_eq!(s["stuck"], true, "{s}");
        assert_eq!(s["granted_ttl"], 10, "{s}");
        assert_eq!(s["holds"].as_array().unwrap().len(), 1, "{s}");
        let wait = &s["waits"][0];
        assert_eq!(wait["position"], 1, "{s}");
        let (identity, holds, waits_for, blocked_by) = if s["lease"] == ha.as_str() {
            ("proc-a", "t/x", "t/y", &hb)
        } else {
            assert_eq!(s["lease"], hb.as_str());
            ("proc-b", "t/y", "t/x", &ha)
        };
        assert_eq!(s["identity"], identity, "{s}");
        assert_eq!(s["holds"][0]["name"], holds, "{s}");
        assert_eq!(wait["name"], waits_for, "{s}");
        assert_eq!(wait["blocked_by"], serde_json::json!([blocked_by]), "{s}");
    }
    let cycles = graph["cycles"].as_array().unwrap();
    assert_eq!(cycles.len(), 1, "{stdout}");
    let steps = cycles[0].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    for step in steps {
        let (waits_for, held_by, identity) = if step["lease"] == ha.as_str() {
            ("t/y", &hb, "proc-a")
        } else {
            ("t/x", &ha, "proc-b")
        };
        assert_eq!(step["waits_for"], waits_for, "{step}");
        assert_eq!(step["held_by"], held_by.as_str(), "{step}");
        assert_eq!(step["identity"], identity, "{step}");
    }

    drop(x);
    drop(y);
    for wait in waits {
        wait.join().unwrap().unwrap();
    }
    let out = etcd_sync(&server, &["top", "--json", "t/"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with(r#"{"prefix":"t/","revision":"#)
            && stdout
                .trim_end()
                .ends_with(r#","names":[],"sessions":[],"cycles":[]}"#),
        "{stdout}"
    );
}

/// `tmux -L <socket> ARGS...`: a tmux server of this test's own.
fn tmux(socket: &str, args: &[&str]) -> std::process::Output {
    Command::new("tmux")
        .arg("-L")
        .arg(socket)
        .args(args)
        .output()
        .expect("run tmux")
}

/// Kills the test's tmux server, pass or fail.
struct TmuxServer(String);

impl Drop for TmuxServer {
    fn drop(&mut self) {
        let _ = tmux(&self.0, &["kill-server"]);
    }
}

#[test]
fn top_in_a_terminal_shows_the_holder_the_waiter_and_a_cycle_and_quits_on_q() {
    if Command::new("tmux").arg("-V").output().is_err() {
        eprintln!("tmux is not installed: skipped (apt-get install tmux)");
        return;
    }
    let server = etcd();
    let c = client(&server.endpoints());
    let holder = named(&c, "the-holder");
    let waiter = named(&c, "the-waiter");
    let guard = holder.mutex("tm/job").unwrap().lock().unwrap();
    let waiting = {
        let m = waiter.mutex("tm/job").unwrap();
        std::thread::spawn(move || m.lock_timeout(Duration::from_secs(60)).map(drop))
    };
    assert!(eventually(WAIT, || keys(&c, "tm/").len() == 2));

    let socket = format!("etcd-sync-top-{}", std::process::id());
    let _server = TmuxServer(socket.clone());
    let command = format!(
        "{} --endpoints {} top tm/; echo \"top exited $?\"; sleep 60",
        env!("CARGO_BIN_EXE_etcd-sync"),
        server.endpoint()
    );
    let started = tmux(
        &socket,
        &[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "160",
            "-y",
            "40",
            &command,
        ],
    );
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    let pane = || {
        String::from_utf8_lossy(&tmux(&socket, &["capture-pane", "-p", "-t", "top"]).stdout)
            .into_owned()
    };
    let (h, w) = (
        format!("{:x}", holder.lease_id()),
        format!("{:x}", waiter.lease_id()),
    );
    let shows = |screen: &str| {
        screen
            .lines()
            .any(|l| l.contains("holder") && l.contains(&h) && l.contains("the-holder"))
            && screen.lines().any(|l| {
                l.contains("waiter")
                    && l.contains(&w)
                    && l.contains("the-waiter")
                    && l.contains("1 ahead")
            })
    };
    assert!(eventually(WAIT, || shows(&pane())), "{}", pane());
    let screen = pane();
    assert!(screen.contains("tm/job  held by 1, 1 waiting"), "{screen}");
    assert!(screen.contains("no cycles"), "{screen}");
    // It refreshes: the wait's time grows, measured from top's first look ("+"). (Read
    // as a number: on a busy machine a capture may miss the second that shows "2s+".)
    let waited = |screen: &str| -> Option<u64> {
        let line = screen.lines().find(|l| l.contains("the-waiter"))?;
        let rest = &line[line.find("waiting ")? + "waiting ".len()..];
        rest[..rest.find("s+")?].parse().ok()
    };
    let mut seen = Vec::new();
    assert!(
        eventually(WAIT, || {
            let now = waited(&pane());
            if seen.last() != Some(&now) {
                seen.push(now);
            }
            now.is_some_and(|s| s >= 2)
        }),
        "waits shown: {seen:?}\n{}",
        pane()
    );

    // The holder lets go: the waiter holds, at the next refresh.
    drop(guard);
    waiting.join().unwrap().unwrap();
    assert!(
        eventually(WAIT, || pane()
            .contains("no locks, semaphores or elections")),
        "{}",
        pane()
    );

    // Two sessions that wait for each other under the prefix: the cycle shows, naming both.
    let x = holder.mutex("tm/x").unwrap().lock().unwrap();
    let y = waiter.mutex("tm/y").unwrap().lock().unwrap();
    let crossed: Vec<_> = [(&holder, "tm/y"), (&waiter, "tm/x")]
        .into_iter()
        .map(|(s, name)| {
            let m = s.mutex(name).unwrap();
            std::thread::spawn(move || m.lock_timeout(Duration::from_secs(60)).map(drop))
        })
        .collect();
    let cycle = [
        format!("{h} (the-holder) waits for tm/y held by {w} (the-waiter)"),
        format!("{w} (the-waiter) waits for tm/x held by {h} (the-holder)"),
    ];
    let shows_cycle = |screen: &str| {
        screen.contains("CYCLE (deadlock):") && cycle.iter().all(|step| screen.contains(step))
    };
    assert!(eventually(WAIT, || shows_cycle(&pane())), "{}", pane());
    drop(x);
    drop(y);
    for wait in crossed {
        wait.join().unwrap().unwrap();
    }
    assert!(
        eventually(WAIT, || pane().contains("no cycles")),
        "{}",
        pane()
    );

    let sent = tmux(&socket, &["send-keys", "-t", "top", "q"]);
    assert!(sent.status.success());
    assert!(
        eventually(WAIT, || pane().contains("top exited 0")),
        "{}",
        pane()
    );
}
