//! Start real etcd servers and clusters on `127.0.0.1` for tests, benches and examples.
//!
//! This module is only compiled with the `testing` cargo feature. It runs the real `etcd`
//! binary (3.4 or newer) as child processes: [`EtcdServer`] is a single-member cluster,
//! [`EtcdCluster`] a multi-member one whose members can be paused (`SIGSTOP`), resumed,
//! killed and restarted to exercise failover.
//!
//! # Finding the binary
//!
//! [`etcd_binary`] uses, in order: the `ETCD_BIN` environment variable (an error if it
//! names a file that does not exist); with the cargo feature `vendored-etcd`, the official
//! etcd release binary that the crate registry delivers with `etcd-bin-vendored` (nothing
//! to install: `etcd-sync = { features = ["testing", "vendored-etcd"] }` in
//! `[dev-dependencies]`); `etcd` on `PATH`, then `/usr/bin/etcd`. On Debian and Ubuntu,
//! `apt-get install etcd-server` provides it. The vendored crates ship `etcd` only: the
//! few helpers that run `etcdctl` (auth, learners) need one installed. [`etcdctl_binary`] does the same with
//! `ETCDCTL_BIN`, `etcdctl` and Debian's `etcd-client` package, and prefers the `etcdctl`
//! beside `ETCD_BIN`, so interop runs against the server's own release.
//!
//! # Versions
//!
//! The server's version is read from `etcd --version` ([`etcd_version`],
//! [`EtcdServer::version`]); etcd older than 3.4 is refused, and flags are spelled for the
//! version that runs ([`EtcdVersion::flag`]: 3.6 renamed some `--experimental-*` flags). The
//! crate's own suite runs on 3.4 through 3.7 (`scripts/test`, CONTRIBUTING.md).
//!
//! # What a server looks like
//!
//! Every member listens on free ports of `127.0.0.1` (picked by binding port 0; if etcd
//! fails to start, for example because another process grabbed a port in the meantime, the
//! whole start is retried with fresh ports, up to 3 attempts in all), and keeps its data in a
//! fresh directory under [`std::env::temp_dir`] (mode `0700`) that is removed on drop. etcd's
//! stdout and stderr go to `etcd.log` next to the member's data directory; when a start
//! fails, the error message includes the last lines of that log. Environment variables
//! starting with `ETCD_` (except `ETCD_UNSUPPORTED_ARCH`) are not passed to etcd: etcd reads
//! them as configuration, and refuses to start if one conflicts with a command-line flag.
//!
//! Startup times with the default raft timings (100 ms heartbeat, 1 s election timeout): a
//! new single member is healthy after 0.1 to 1 s (it waits a random part of its election
//! timeout before electing itself), a restarted one after 1 to 2 s (a full election
//! timeout), and a new 3-member cluster after 0.3 to 2.5 s (etcd 3.4 spends up to a second
//! checking whether its peers were already bootstrapped, then connects to them). Tests that
//! start many servers can pass smaller timings, for example
//! `.args(["--heartbeat-interval=20", "--election-timeout=200"])`.
//!
//! # Network partitions
//!
//! [`NetFaults`] cuts links for real (nftables rules dropping or resetting packets) between
//! the test's clients and members, or between members, inside a private network namespace
//! that the test runs itself in (Linux, as root, with `unshare` and `nft`). Members then
//! listen on their own loopback addresses ([`EtcdClusterBuilder::member_addresses`]) and run
//! as their own users ([`EtcdClusterBuilder::member_uids`]), so rules can tell them apart.
//!
//! # Reading metrics
//!
//! [`EtcdServer::metrics`] and [`EtcdCluster::metrics`] return etcd's Prometheus text as
//! it is; [`metrics::parse`] turns it into samples to look up by name and labels.
//!
//! # Process hygiene
//!
//! Every etcd process is killed (`SIGKILL`) and waited for when its [`EtcdServer`] or
//! [`EtcdCluster`] is dropped, including during the unwinding of a panicking test, and
//! including paused members. In case the test process dies without unwinding (abort, a
//! signal), each etcd process is also started with the Linux parent-death signal
//! (`PR_SET_PDEATHSIG`) set to `SIGKILL`. That signal is tied to the *thread* that spawned
//! the process, not to the whole process: etcd is killed as soon as the thread that started
//! it (or restarted it) exits. Drop a server before the thread that started it exits, which
//! is what happens naturally in a test function; do not start one lazily from a test thread
//! into a `static` shared by other tests.
//!
//! # Example
//!
//! ```no_run
//! use etcd_sync::testing::{EtcdCluster, EtcdServer};
//!
//! let etcd = EtcdServer::start()?;
//! println!("etcd is listening on {}", etcd.endpoint());
//!
//! let cluster = EtcdCluster::start(3)?;
//! let leader = cluster.leader()?;
//! cluster.kill(leader)?;
//! let new_leader = cluster.leader()?;
//! assert_ne!(leader, new_leader);
//! # Ok::<(), std::io::Error>(())
//! ```

#[cfg(not(unix))]
compile_error!(
    "etcd_sync::testing starts etcd processes with Unix signals and needs a Unix platform"
);

mod auth;
mod binary;
mod certs;
mod cluster;
mod error;
mod etcdctl;
mod health;
mod http;
mod learner;
mod member;
mod membership;
pub mod metrics;
mod netns;
mod partition;
mod process;
mod proxy;
mod scratch;
mod server;
#[cfg(feature = "simulation")]
pub mod sim;
mod start;
mod version;
mod watch;

#[doc(hidden)]
pub use crate::support::tuning::LineTuning;
pub use auth::{AUTH_PREFIX, AUTH_ROOT, AUTH_USER};
pub use binary::{etcd_binary, etcdctl_binary};
pub use certs::TlsCerts;
pub use cluster::EtcdCluster;
pub use partition::{Cut, Fault, NetFaults, Node};
pub use proxy::{EtcdProxy, EtcdProxyBuilder};
pub use server::{EtcdServer, EtcdServerBuilder};
pub use start::EtcdClusterBuilder;
pub use version::{EtcdVersion, etcd_version};
pub use watch::RawWatch;
