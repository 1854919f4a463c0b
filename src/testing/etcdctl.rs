//! Running the real `etcdctl` against a member, as an operator would: for the cluster
//! changes (auth, learners) that tests set up the way people do it.

use std::io;
use std::process::Command;

use super::binary::etcdctl_binary;
use super::certs::TlsCerts;
use super::error::context;

/// Runs `etcdctl --endpoints endpoint args...` (with the cluster's client certificate when
/// it serves TLS) and returns its standard output.
///
/// The environment is cleared: `ETCDCTL_*` variables of the user's shell would otherwise
/// change what the command does.
pub(super) fn run(endpoint: &str, tls: Option<&TlsCerts>, args: &[&str]) -> io::Result<String> {
    let etcdctl = etcdctl_binary()?;
    let mut command = Command::new(&etcdctl);
    command.env_clear().arg("--endpoints").arg(endpoint);
    if let Some(tls) = tls {
        command
            .arg("--cacert")
            .arg(&tls.ca_cert)
            .arg("--cert")
            .arg(&tls.client_cert)
            .arg("--key")
            .arg(&tls.client_key);
    }
    let output = command
        .args(args)
        .output()
        .map_err(|e| context(e, format_args!("cannot run {}", etcdctl.display())))?;
    if !output.status.success() {
        return Err(io::Error::other(format!(
            "etcdctl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
