//! `--serve-etcd`: the one throwaway etcd of a `scripts/bench-compare` run, started by
//! `testing::EtcdServer` (free loopback ports, a private data directory under the system's
//! temporary directory, health-checked, three attempts), so the script does not pick ports
//! or start etcd itself. Prints `ENDPOINT <url>`, `PID <pid>` and `LOG <path>` on stdout,
//! then keeps etcd running until its stdin closes: the script holds that pipe and closes
//! it when it exits, pass or fail (also when it is killed), and etcd goes with the server.

use std::io::{Read, Write};

use crate::Res;

/// Serves one etcd until stdin closes.
pub fn serve() -> Res<()> {
    let server = etcd_sync::testing::EtcdServer::start()?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ENDPOINT {}", server.endpoint())?;
    writeln!(out, "PID {}", server.pid().unwrap_or(0))?;
    writeln!(out, "LOG {}", server.log_path().display())?;
    out.flush()?;
    drop(out);
    let mut rest = Vec::new();
    // EOF (or an error) on stdin: the script is done with this etcd.
    let _ = std::io::stdin().read_to_end(&mut rest);
    drop(server);
    Ok(())
}
