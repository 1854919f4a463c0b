//! The environment variables behind the global options: ours (`ETCD_SYNC_*`) first, then
//! etcdctl's (`ETCDCTL_*`) for the options etcdctl has too, so that a shell set up for
//! etcdctl works as it is. clap reads one variable per option: the one it reads is
//! chosen here, before parsing. `--help` lists both (the options' own text).

use clap::{ArgMatches, CommandFactory, FromArgMatches};

use crate::args::Cli;

/// Option (clap id), our variable, etcdctl's.
const FALLBACKS: &[(&str, &str, &str)] = &[
    ("endpoints", "ETCD_SYNC_ENDPOINTS", "ETCDCTL_ENDPOINTS"),
    (
        "dial_timeout",
        "ETCD_SYNC_DIAL_TIMEOUT",
        "ETCDCTL_DIAL_TIMEOUT",
    ),
    (
        "command_timeout",
        "ETCD_SYNC_COMMAND_TIMEOUT",
        "ETCDCTL_COMMAND_TIMEOUT",
    ),
    ("cacert", "ETCD_SYNC_CACERT", "ETCDCTL_CACERT"),
    ("cert", "ETCD_SYNC_CERT", "ETCDCTL_CERT"),
    ("key", "ETCD_SYNC_KEY", "ETCDCTL_KEY"),
    ("user", "ETCD_SYNC_USER", "ETCDCTL_USER"),
    ("password", "ETCD_SYNC_PASSWORD", "ETCDCTL_PASSWORD"),
];

/// Parses the command line (exiting with clap's message and code 2 on bad arguments, or 0
/// after `--help`/`--version`), each option read from the first of its variables that is
/// set and not empty when the flag is not given.
pub fn parse() -> Cli {
    let mut command = Cli::command();
    for &(id, ours, etcdctl) in FALLBACKS {
        if !is_set(ours) && is_set(etcdctl) {
            command = command.mut_arg(id, |arg| arg.env(etcdctl));
        }
    }
    let matches: ArgMatches = command.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Set and not empty (clap takes an empty variable as not set).
fn is_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|value| !value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fallback_names_an_option_with_our_variable() {
        let command = Cli::command();
        for &(id, ours, etcdctl) in FALLBACKS {
            let arg = command
                .get_arguments()
                .find(|arg| arg.get_id() == id)
                .unwrap_or_else(|| panic!("no option {id}"));
            assert_eq!(arg.get_env(), Some(std::ffi::OsStr::new(ours)), "{id}");
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            assert!(
                help.contains(&format!("[env: {ours}, then {etcdctl}]")),
                "{id}: {help}"
            );
        }
    }
}
