//! One etcd member: its command line, its process (start, pause, resume, kill), its log.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};

use super::certs::TlsCerts;
use super::error::context;
use super::process::{send_signal, spawn_dying_with_parent, wait_all_threads_stopped};
use super::scratch::create_private_dir;
use super::version::EtcdVersion;

/// Lines of the etcd log quoted in error messages.
const LOG_TAIL_LINES: usize = 25;
/// At most this many bytes at the end of the log are read to find its last lines, so a
/// huge log does not slow down an error path.
const LOG_TAIL_BYTES: u64 = 64 * 1024;
/// File, in each member's directory, that receives etcd's stdout and stderr.
const LOG_FILE_NAME: &str = "etcd.log";

/// What every member of one cluster shares.
pub(super) struct MemberConfig<'a> {
    pub(super) binary: &'a Path,
    pub(super) dir: &'a Path,
    pub(super) initial_cluster: &'a str,
    pub(super) token: &'a str,
    pub(super) extra_args: &'a [OsString],
    pub(super) tls: Option<&'a TlsCerts>,
    /// Whether the member joins a running cluster (a learner added with `member add`)
    /// instead of bootstrapping a new one with its peers.
    pub(super) joining: bool,
    /// The server's version, for the flags it takes.
    pub(super) version: EtcdVersion,
}

/// Where one member listens (its loopback address and ports) and as whom it runs.
pub(super) struct MemberPorts {
    /// The address of all three listeners: 127.0.0.1 unless the cluster gave each member
    /// its own ([`EtcdClusterBuilder::member_addresses`](super::EtcdClusterBuilder::member_addresses)).
    pub(super) ip: Ipv4Addr,
    pub(super) client: u16,
    pub(super) peer: u16,
    pub(super) metrics: u16,
    /// The user id etcd runs as, if not ours
    /// ([`EtcdClusterBuilder::member_uids`](super::EtcdClusterBuilder::member_uids)).
    pub(super) uid: Option<u32>,
}

impl MemberPorts {
    /// Ports on 127.0.0.1, etcd running as the current user.
    pub(super) fn localhost(client: u16, peer: u16, metrics: u16) -> MemberPorts {
        MemberPorts {
            ip: Ipv4Addr::LOCALHOST,
            client,
            peer,
            metrics,
            uid: None,
        }
    }
}

/// The `--name` of member `i`, also its key in `--initial-cluster`.
pub(super) fn member_name(i: usize) -> String {
    format!("m{i}")
}

/// The URL peers reach a member on.
pub(super) fn peer_url(ip: Ipv4Addr, port: u16) -> String {
    format!("http://{ip}:{port}")
}

/// The voters' settings a member added later (a learner) starts with too.
#[derive(Debug)]
pub(super) struct JoinSettings {
    pub(super) binary: PathBuf,
    pub(super) token: String,
    pub(super) extra_args: Vec<OsString>,
}

/// One etcd process: how to start it, and its current state.
#[derive(Debug)]
pub(super) struct Member {
    pub(super) name: String,
    binary: PathBuf,
    args: Vec<OsString>,
    pub(super) data_dir: PathBuf,
    pub(super) log_path: PathBuf,
    pub(super) client_url: String,
    /// The URL its peers reach it on (`--initial-advertise-peer-urls`).
    pub(super) peer_url: String,
    /// Plain-HTTP listener for /health and /metrics (`--listen-metrics-urls`), so health
    /// checks work the same with and without TLS on the client port.
    pub(super) metrics_addr: SocketAddr,
    /// The address and port of the client listener.
    pub(super) client_addr: SocketAddr,
    /// The port of the peer listener (on the client listener's address).
    pub(super) peer_port: u16,
    /// The user id etcd runs as, if not ours.
    pub(super) uid: Option<u32>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The process, from spawn until it is killed or found to have exited (and reaped).
    child: Option<Child>,
    /// Whether the process was sent `SIGSTOP` (and no `SIGCONT` since).
    paused: bool,
    /// How the process ended, if it exited without being killed by us.
    exited: Option<ExitStatus>,
}

impl Member {
    pub(super) fn new(
        config: &MemberConfig<'_>,
        index: usize,
        ports: &MemberPorts,
    ) -> io::Result<Member> {
        let name = member_name(index);
        let member_dir = config.dir.join(&name);
        create_private_dir(&member_dir)?;
        if let Some(uid) = ports.uid {
            // etcd creates its data directory in here, as that user.
            std::os::unix::fs::chown(&member_dir, Some(uid), None).map_err(|e| {
                context(
                    e,
                    format_args!("cannot give {} to uid {uid}", member_dir.display()),
                )
            })?;
        }
        let data_dir = member_dir.join("data");
        let log_path = member_dir.join(LOG_FILE_NAME);
        let client_addr = SocketAddr::from((ports.ip, ports.client));
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let client_url = format!("{scheme}://{client_addr}");
        let metrics_addr = SocketAddr::from((ports.ip, ports.metrics));
        let peer_url = peer_url(ports.ip, ports.peer);
        let mut args: Vec<OsString> = Vec::new();
        let mut flag = |flag: &str, value: OsString| {
            args.push(flag.into());
            args.push(value);
        };
        flag("--name", name.clone().into());
        flag("--data-dir", data_dir.clone().into());
        flag("--listen-client-urls", client_url.clone().into());
        flag("--advertise-client-urls", client_url.clone().into());
        flag("--listen-peer-urls", peer_url.clone().into());
        flag("--initial-advertise-peer-urls", peer_url.clone().into());
        flag("--initial-cluster", config.initial_cluster.into());
        flag("--initial-cluster-token", config.token.into());
        let state = if config.joining { "existing" } else { "new" };
        flag("--initial-cluster-state", state.into());
        flag(
            "--listen-metrics-urls",
            format!("http://{metrics_addr}").into(),
        );
        if let Some(tls) = config.tls {
            flag("--cert-file", tls.server_cert.clone().into());
            flag("--key-file", tls.server_key.clone().into());
            flag("--trusted-ca-file", tls.ca_cert.clone().into());
            args.push("--client-cert-auth".into());
        }
        // 3.4's default logger (capnslog) is deprecated and warns; zap is the only one
        // from 3.5 on, where the flag is not needed.
        if !config.version.at_least(3, 5) {
            args.push("--logger=zap".into());
        }
        args.extend(config.extra_args.iter().cloned());
        Ok(Member {
            name,
            binary: config.binary.to_path_buf(),
            args,
            data_dir,
            log_path,
            client_url,
            peer_url,
            metrics_addr,
            client_addr,
            peer_port: ports.peer,
            uid: ports.uid,
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock leaves nothing half-updated: each field is valid alone.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The state, after noticing (and reaping) a process that exited on its own.
    fn lock_reaped(&self) -> MutexGuard<'_, State> {
        let mut state = self.lock();
        if let Some(child) = state.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            state.child = None;
            state.paused = false;
            state.exited = Some(status);
        }
        state
    }

    /// Starts the process; its output is appended to the log file.
    pub(super) fn spawn(&self) -> io::Result<()> {
        let mut state = self.lock_reaped();
        if state.child.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("etcd member {} is already running", self.name),
            ));
        }
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| context(e, format_args!("cannot open {}", self.log_path.display())))?;
        let command_line = std::iter::once(self.binary.as_os_str())
            .chain(self.args.iter().map(|arg| arg.as_os_str()))
            .map(|arg| arg.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        writeln!(log, "=== etcd-sync: starting {command_line}")?;
        let stderr = log.try_clone()?;
        let mut command = Command::new(&self.binary);
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr);
        if let Some(uid) = self.uid {
            std::os::unix::process::CommandExt::uid(&mut command, uid);
        }
        for (key, _) in std::env::vars_os() {
            if is_etcd_config_var(&key) {
                command.env_remove(key);
            }
        }
        let child = spawn_dying_with_parent(&mut command).map_err(|e| {
            context(
                e,
                format_args!(
                    "cannot run {} for etcd member {}",
                    self.binary.display(),
                    self.name
                ),
            )
        })?;
        state.child = Some(child);
        state.paused = false;
        state.exited = None;
        Ok(())
    }

    /// `SIGKILL`s (and `SIGCONT`s, in case it is paused) the process and waits for it.
    pub(super) fn kill(&self) -> io::Result<()> {
        // Not reaped first: killing a process that exited on its own counts as killing it.
        let mut state = self.lock();
        let Some(mut child) = state.child.take() else {
            return Ok(());
        };
        if let Err(e) = child.kill() {
            // Do not wait for a process we could not kill: that could block forever.
            state.child = Some(child);
            return Err(context(
                e,
                format_args!("cannot kill etcd member {}", self.name),
            ));
        }
        // SIGKILL also ends a stopped process; SIGCONT is for good measure. The process is
        // not reaped yet, so its pid cannot have been reused.
        let _ = send_signal(&child, libc::SIGCONT);
        state.paused = false;
        state.exited = None;
        child
            .wait()
            .map(drop)
            .map_err(|e| context(e, format_args!("cannot wait for etcd member {}", self.name)))
    }

    /// Kills the process if it still runs and forgets how it ended: a member removed from
    /// the cluster (whose etcd exits by itself) then counts as killed, not as crashed.
    pub(super) fn retire(&self) -> io::Result<()> {
        self.kill()?;
        let mut state = self.lock();
        state.child = None;
        state.paused = false;
        state.exited = None;
        Ok(())
    }

    pub(super) fn pause(&self) -> io::Result<()> {
        self.set_paused(true)
    }

    pub(super) fn resume(&self) -> io::Result<()> {
        self.set_paused(false)
    }

    fn set_paused(&self, paused: bool) -> io::Result<()> {
        let mut state = self.lock_reaped();
        let Some(child) = state.child.as_ref() else {
            return Err(self.not_running(&state));
        };
        let (signal, action) = if paused {
            (libc::SIGSTOP, "pause")
        } else {
            (libc::SIGCONT, "resume")
        };
        send_signal(child, signal)
            .map_err(|e| context(e, format_args!("cannot {action} etcd member {}", self.name)))?;
        if paused {
            // Tests that pause and then send a request rely on it not being answered.
            wait_all_threads_stopped(child.id());
        }
        state.paused = paused;
        Ok(())
    }

    pub(super) fn pid(&self) -> Option<u32> {
        self.lock_reaped().child.as_ref().map(Child::id)
    }

    pub(super) fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// Whether the process runs and was not paused: only then can it answer requests.
    pub(super) fn is_answering(&self) -> bool {
        let state = self.lock_reaped();
        state.child.is_some() && !state.paused
    }

    /// Whether the process was stopped on purpose (killed, or never started), as opposed to
    /// running or having exited on its own.
    pub(super) fn was_killed(&self) -> bool {
        let state = self.lock_reaped();
        state.child.is_none() && state.exited.is_none()
    }

    /// `Ok` if the process runs (paused or not), else the error that explains why not.
    pub(super) fn check_running(&self) -> io::Result<()> {
        let state = self.lock_reaped();
        match state.child {
            Some(_) => Ok(()),
            None => Err(self.not_running(&state)),
        }
    }

    /// The error for an operation that needs a running process.
    fn not_running(&self, state: &State) -> io::Error {
        match state.exited {
            Some(status) => {
                let hint = if status.signal() == Some(libc::SIGKILL) {
                    " (not by etcd_sync::testing: by the OOM killer, or by the parent-death \
                     signal because the thread that started it exited)"
                } else {
                    ""
                };
                io::Error::other(format!(
                    "etcd member {} ({}) exited: {status}{hint}; last lines of {}:\n{}",
                    self.name,
                    self.client_url,
                    self.log_path.display(),
                    self.log_tail()
                ))
            }
            None => io::Error::new(
                io::ErrorKind::NotConnected,
                format!(
                    "etcd member {} ({}) is not running (it was killed)",
                    self.name, self.client_url
                ),
            ),
        }
    }

    /// The last lines of the log, or why they cannot be read: for error messages.
    pub(super) fn log_tail(&self) -> String {
        read_tail(&self.log_path, LOG_TAIL_LINES)
            .unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log_path.display()))
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// Environment variables that etcd would read as configuration (and that make it refuse to
/// start when they conflict with a flag), except the one needed on some architectures.
pub(super) fn is_etcd_config_var(key: &std::ffi::OsStr) -> bool {
    key.to_str()
        .is_some_and(|key| key.starts_with("ETCD_") && key != "ETCD_UNSUPPORTED_ARCH")
}

/// The last `lines` lines of a file (looking at its last [`LOG_TAIL_BYTES`] bytes only).
fn read_tail(path: &Path, lines: usize) -> io::Result<String> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    Ok(all[all.len().saturating_sub(lines)..].join("\n"))
}
