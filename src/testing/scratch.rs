//! What a test etcd borrows from the machine: a private directory under the system's
//! temporary directory, free loopback ports, and names no other run uses.

use std::fs;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::error::context;

/// A directory under [`std::env::temp_dir`], removed (with its contents) on drop.
#[derive(Debug)]
pub(super) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub(super) fn create(name: &str) -> io::Result<TempDir> {
        let path = std::env::temp_dir().join(name);
        create_private_dir(&path)?;
        Ok(TempDir { path })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Creates `path` with mode `0700`: data directories and private keys are nobody else's.
pub(super) fn create_private_dir(path: &Path) -> io::Result<()> {
    fs::DirBuilder::new().mode(0o700).create(path).map_err(|e| {
        context(
            e,
            format_args!("cannot create directory {}", path.display()),
        )
    })
}

/// `pid-counter-nanos`: unique within this process, and across processes.
pub(super) fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since_epoch| since_epoch.subsec_nanos());
    format!("{}-{count}-{nanos}", std::process::id())
}

/// Free ports on 127.0.0.1, all different: every listener is held until all are picked.
/// They are drawn below the kernel's ephemeral range (`ip_local_port_range`), from which
/// outgoing connections take their source ports: a member stopped for a while (a restart,
/// a partition) finds its port free again, where an ephemeral port could have become some
/// connection's source port meanwhile (seen: `bind: address already in use` on a restart).
/// If that range leaves too little room below it, any free port.
pub(super) fn free_ports(count: usize) -> io::Result<Vec<u16>> {
    let listeners = match below_ephemeral(count) {
        Some(listeners) => listeners,
        None => (0..count)
            .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| context(e, "cannot pick a free port on 127.0.0.1"))?,
    };
    listeners
        .iter()
        .map(|listener| listener.local_addr().map(|addr| addr.port()))
        .collect()
}

/// `count` listeners on ports in [10000, the ephemeral range's first port), from a place
/// that differs by process and call; `None` if that range is smaller than 4,096 ports or
/// too few of them are free.
fn below_ephemeral(count: usize) -> Option<Vec<TcpListener>> {
    const LOW: u32 = 10_000;
    let range = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let high: u32 = range.split_whitespace().next()?.parse().ok()?;
    let width = high.checked_sub(LOW).filter(|w| *w >= 4_096)?;
    let mut seed = unique_suffix()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let mut listeners = Vec::with_capacity(count);
    for _ in 0..count * 64 {
        if listeners.len() == count {
            break;
        }
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let port = u16::try_from(LOW + ((seed >> 33) as u32) % width).ok()?;
        if let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
            listeners.push(listener);
        }
    }
    (listeners.len() == count).then_some(listeners)
}
