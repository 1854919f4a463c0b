//! The global options of `etcd-sync`: where etcd is and how to talk to it.

use std::time::Duration;

use clap::Args;
use etcd_sync::{Client, ClientBuilder};

use crate::text;

/// Options for every subcommand: where etcd is and how to talk to it. They may be given
/// before or after the subcommand. `Debug` is written by hand: it never shows a password.
#[derive(Args)]
#[command(next_help_heading = "Global options")]
pub struct GlobalOpts {
    /// etcd endpoints, comma separated [env: ETCD_SYNC_ENDPOINTS, then ETCDCTL_ENDPOINTS]
    #[arg(
        long,
        global = true,
        env = "ETCD_SYNC_ENDPOINTS",
        hide_env = true,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379",
        value_name = "URLS"
    )]
    endpoints: Vec<String>,

    /// Session (lease) TTL in seconds: how long etcd keeps our key after etcd-sync stops
    /// renewing it, and about how soon a lost lock is noticed
    #[arg(long, global = true, default_value_t = 10, value_parser = parse_ttl, value_name = "SECONDS")]
    ttl: u64,

    /// Time limit for connecting to etcd (e.g. 3s, 500ms, at most 1h); until an endpoint
    /// answers, every endpoint is tried again and again [env: ETCD_SYNC_DIAL_TIMEOUT, then
    /// ETCDCTL_DIAL_TIMEOUT]
    #[arg(
        long,
        global = true,
        env = "ETCD_SYNC_DIAL_TIMEOUT",
        hide_env = true,
        default_value = "3s",
        value_parser = text::parse_duration,
        value_name = "DURATION"
    )]
    dial_timeout: Duration,

    /// Time limit for each etcd request (grant, release, revoke, ...) [env:
    /// ETCD_SYNC_COMMAND_TIMEOUT, then ETCDCTL_COMMAND_TIMEOUT]
    #[arg(
        long,
        global = true,
        env = "ETCD_SYNC_COMMAND_TIMEOUT",
        hide_env = true,
        default_value = "5s",
        value_parser = text::parse_duration,
        value_name = "DURATION"
    )]
    command_timeout: Duration,

    /// CA certificate (PEM) that signed etcd's certificate; turns on TLS (https) [env:
    /// ETCD_SYNC_CACERT, then ETCDCTL_CACERT]
    #[arg(
        long,
        global = true,
        env = "ETCD_SYNC_CACERT",
        hide_env = true,
        value_name = "FILE"
    )]
    cacert: Option<std::path::PathBuf>,

    /// Client certificate (PEM) for etcd's --client-cert-auth; needs --key and --cacert
    /// [env: ETCD_SYNC_CERT, then ETCDCTL_CERT]
    #[arg(
        long,
        global = true,
        env = "ETCD_SYNC_CERT",
        hide_env = true,
        value_name = "FILE",
        requires = "key"
    )]
    cert: Option<std::path::PathBuf>,

    /// Private key (PEM) of the client certificate [env: ETCD_SYNC_KEY, then ETCDCTL_KEY]
    #[arg(
        long,
        global = true,
        env = "ETCD_SYNC_KEY",
        hide_env = true,
        value_name = "FILE",
        requires = "cert"
    )]
    key: Option<std::path::PathBuf>,

    /// Who this process is, stored as the value of its lock keys and shown by `status`
    /// (default "<hostname>:<pid>"; `elect` stores PROPOSAL instead) [env:
    /// ETCD_SYNC_IDENTITY]
    #[arg(
        long,
        global = true,
        env = "ETCD_SYNC_IDENTITY",
        hide_env = true,
        value_parser = parse_identity,
        value_name = "TEXT"
    )]
    identity: Option<String>,

    /// etcd user, as NAME or NAME:PASSWORD (etcd auth) [env: ETCD_SYNC_USER, then
    /// ETCDCTL_USER]
    #[arg(
        long,
        global = true,
        env = "ETCD_SYNC_USER",
        hide_env = true,
        value_name = "USER"
    )]
    user: Option<String>,

    /// Password for --user (prefer the environment) [env: ETCD_SYNC_PASSWORD, then
    /// ETCDCTL_PASSWORD]
    #[arg(
        long,
        global = true,
        env = "ETCD_SYNC_PASSWORD",
        hide_env = true,
        value_name = "PASSWORD"
    )]
    password: Option<String>,

    /// Do not say what a wait waits for (by default, after 3s of waiting and then every
    /// 10s, one line on stderr: who holds NAME and how many are ahead)
    #[arg(short, long, global = true)]
    pub quiet: bool,

    /// Log the library's events to stderr (connect, watches, enqueue, handoff, loss): -v
    /// info, -vv debug, -vvv trace. RUST_LOG (tracing directives, e.g.
    /// `etcd_sync=debug,h2=info`) is read too
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// The level of the library's events on stderr, instead of -v
    #[arg(
        long,
        global = true,
        value_name = "LEVEL",
        value_parser = ["off", "error", "warn", "info", "debug", "trace"]
    )]
    pub log_level: Option<String>,
}

impl std::fmt::Debug for GlobalOpts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // --user may be NAME:PASSWORD: show only the name.
        let user = self
            .user
            .as_deref()
            .map(|u| u.split_once(':').map_or(u, |(name, _)| name));
        f.debug_struct("GlobalOpts")
            .field("endpoints", &self.endpoints)
            .field("ttl", &self.ttl)
            .field("dial_timeout", &self.dial_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("identity", &self.identity)
            .field("cacert", &self.cacert)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("user", &user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("quiet", &self.quiet)
            .field("verbose", &self.verbose)
            .field("log_level", &self.log_level)
            .finish()
    }
}

impl GlobalOpts {
    /// The client configuration these options describe. Connection options added later
    /// (TLS, authentication) go here.
    pub fn client_builder(&self) -> etcd_sync::Result<ClientBuilder> {
        let endpoints = self
            .endpoints
            .iter()
            .map(|e| e.trim())
            .filter(|e| !e.is_empty());
        let mut builder = Client::builder()
            .endpoints(endpoints)
            .connect_timeout(self.dial_timeout)
            .request_timeout(self.command_timeout);
        match (&self.cacert, &self.cert, &self.key) {
            (Some(ca), cert, key) => {
                let mut tls = etcd_sync::TlsConfig::from_files(ca, None)?;
                if let (Some(cert), Some(key)) = (cert, key) {
                    tls = tls.client_identity_files(cert, key)?;
                }
                builder = builder.tls(tls);
            }
            (None, Some(_), _) | (None, _, Some(_)) => {
                return Err(etcd_sync::Error::InvalidArgument(
                    "--cert/--key need --cacert (the CA that signed etcd's certificate)".into(),
                ));
            }
            (None, None, None) => {}
        }
        if let Some(user) = &self.user {
            let (name, password) = match (user.split_once(':'), &self.password) {
                (Some((name, password)), _) => (name.to_string(), password.to_string()),
                (None, Some(password)) => (user.clone(), password.clone()),
                (None, None) => {
                    return Err(etcd_sync::Error::InvalidArgument(
                        "--user needs a password: NAME:PASSWORD, --password or ETCD_SYNC_PASSWORD"
                            .into(),
                    ));
                }
            };
            builder = builder.user(name, password);
        }
        Ok(builder)
    }

    pub fn session_ttl(&self) -> Duration {
        Duration::from_secs(self.ttl)
    }

    /// `--identity`, if given: the session's identity instead of "<hostname>:<pid>".
    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }
}

fn parse_ttl(text: &str) -> Result<u64, String> {
    let ttl: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number of seconds"))?;
    let max = etcd_sync::MAX_TTL.as_secs();
    if ttl == 0 || ttl > max {
        return Err(format!("must be between 1 and {max} seconds"));
    }
    Ok(ttl)
}

// Checked here (with the library's own limits) so that a bad identity is refused before
// connecting, like every other argument.
use etcd_sync::MAX_IDENTITY_LEN;

fn parse_identity(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("empty (leave --identity out for \"<hostname>:<pid>\")".into());
    }
    if text.len() > MAX_IDENTITY_LEN {
        return Err(format!(
            "{} bytes; at most {MAX_IDENTITY_LEN} are allowed",
            text.len()
        ));
    }
    if text.chars().any(char::is_control) {
        return Err("contains a control character (status prints it on one line)".into());
    }
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_bounds() {
        assert_eq!(parse_ttl("10"), Ok(10));
        assert!(parse_ttl("0").is_err());
        assert!(parse_ttl("1.5").is_err());
        assert!(parse_ttl("99999999999").is_err());
    }
}
