//! Runs `etcd-sync` and `etcdctl` as child processes: reading their output line by line
//! with deadlines, signalling them, and killing them when a test ends.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use etcd_sync::testing::{EtcdServer, etcdctl_binary};

/// `etcd-sync ARGS...`, with SIGINT and SIGHUP handled even if this test runs with them
/// ignored (etcd-sync keeps signals ignored at startup ignored, as shells do).
pub(crate) fn etcd_sync_bare(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_etcd-sync"));
    // Whatever the environment of the test run says, each test sets what it needs.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("ETCD_SYNC_") || name.starts_with("ETCDCTL_") || name == "RUST_LOG" {
            cmd.env_remove(&*name);
        }
    }
    cmd.args(args);
    // SAFETY: only signal(2), async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGHUP, libc::SIG_DFL);
            Ok(())
        });
    }
    cmd
}

/// `etcd-sync --endpoints <server> ARGS...`.
pub(crate) fn etcd_sync(server: &EtcdServer, args: &[&str]) -> Command {
    let mut cmd = etcd_sync_bare(&["--endpoints", &server.endpoint()]);
    cmd.args(args);
    cmd
}

/// `etcdctl --endpoints <server> ARGS...`.
pub(crate) fn etcdctl(server: &EtcdServer, args: &[&str]) -> Command {
    let mut cmd = Command::new(etcdctl_binary().expect("etcdctl (apt-get install etcd-client)"));
    cmd.env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(server.endpoint())
        .args(args);
    cmd
}

/// A running subprocess whose stdout lines arrive on a channel and whose stderr is
/// collected. On drop (pass or fail) it gets SIGTERM (etcd-sync then stops its CMD and
/// releases), then SIGKILL; process groups registered with `owns_group` get SIGKILL too.
pub(crate) struct Proc {
    pub(crate) child: Child,
    pub(crate) lines: Receiver<String>,
    pub(crate) stderr: Arc<StdMutex<String>>,
    /// Disconnects when the stderr reader reached EOF (everything written is collected).
    pub(crate) stderr_done: Receiver<()>,
    pub(crate) status: Option<ExitStatus>,
    pub(crate) groups: Vec<i32>,
}

impl Proc {
    pub(crate) fn spawn(mut cmd: Command) -> Proc {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr_pipe = child.stderr.take().expect("piped stderr");
        let stderr = Arc::new(StdMutex::new(String::new()));
        let sink = stderr.clone();
        let (done, stderr_done) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            let _done = done;
            let mut buf = [0u8; 1024];
            while let Ok(n @ 1..) = stderr_pipe.read(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                sink.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_str(&text);
            }
        });
        Proc {
            child,
            lines,
            stderr,
            stderr_done,
            status: None,
            groups: Vec::new(),
        }
    }

    pub(crate) fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits")
    }

    /// What the process wrote to stderr so far; once it has exited, all of it (the reader
    /// thread may still be copying the last bytes when the exit is noticed).
    pub(crate) fn stderr(&self) -> String {
        if self.status.is_some() {
            let _ = self.stderr_done.recv_timeout(Duration::from_secs(5));
        }
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The next stdout line; panics (showing stderr) if none comes within `limit`.
    pub(crate) fn line(&self, limit: Duration) -> String {
        match self.lines.recv_timeout(limit) {
            Ok(line) => line,
            Err(e) => panic!("no stdout line ({e:?}); stderr: {}", self.stderr()),
        }
    }

    /// Every remaining stdout line, until EOF; `None` if EOF does not come within `limit`
    /// (something still holds the pipe: a process of CMD's group survived).
    pub(crate) fn rest(&self, limit: Duration) -> Option<Vec<String>> {
        let deadline = Instant::now() + limit;
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(RecvTimeoutError::Disconnected) => return Some(lines),
                Err(RecvTimeoutError::Timeout) => return None,
            }
        }
    }

    /// Remembers CMD's process group (its pid, printed by the test's CMD) for cleanup.
    pub(crate) fn owns_group(&mut self, pgid: i32) {
        self.groups.push(pgid);
    }

    pub(crate) fn signal(&self, signo: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.pid(), signo) };
    }

    pub(crate) fn wait_timeout(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
            if self.status.is_none() {
                if Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.status
    }

    /// The exit code; panics if the process does not exit within `limit` or was killed.
    pub(crate) fn code(&mut self, limit: Duration) -> i32 {
        match self.wait_timeout(limit) {
            Some(status) => match status.code() {
                Some(code) => code,
                None => panic!("killed by a signal: {status:?}; stderr: {}", self.stderr()),
            },
            None => panic!("still running after {limit:?}; stderr: {}", self.stderr()),
        }
    }

    pub(crate) fn is_running(&mut self) -> bool {
        self.wait_timeout(Duration::ZERO).is_none()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.is_running() {
            self.signal(libc::SIGTERM);
            if self.wait_timeout(Duration::from_secs(10)).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        for &pgid in &self.groups {
            // SAFETY: a group this test's CMD created; ESRCH when it is gone already.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
    }
}

/// The lease (hex) in a key `<name>/<lease hex>`.
pub(crate) fn lease_of(key: &str) -> &str {
    key.rsplit('/').next().unwrap_or_default()
}

/// Lease ids (hex) etcd currently knows.
pub(crate) fn leases(server: &EtcdServer) -> String {
    let out = etcdctl(server, &["lease", "list"])
        .output()
        .expect("etcdctl lease list");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
