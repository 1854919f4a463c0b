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
pub(super) fn free_ports(count: usize) -> io::Result<Vec<u16>> {
    let listeners = (0..count)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<io::Result<Vec<_>>>()
        .map_err(|e| context(e, "cannot pick a free port on 127.0.0.1"))?;
    listeners
        .iter()
        .map(|listener| listener.local_addr().map(|addr| addr.port()))
        .collect()
}
