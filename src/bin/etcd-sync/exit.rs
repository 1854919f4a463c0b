//! Exit codes, and how a library error becomes one.

use etcd_sync::Error;

/// A process exit code.
pub type Exit = i32;

pub const EXIT_OK: Exit = 0;
pub const EXIT_ERROR: Exit = 1;
/// Bad arguments (also those only the library can check: endpoints, durations, names).
pub const EXIT_USAGE: Exit = 2;
pub const EXIT_LOST: Exit = 3;
pub const EXIT_TIMEOUT: Exit = 4;
pub const EXIT_CANNOT_EXECUTE: Exit = 126;
pub const EXIT_NOT_FOUND: Exit = 127;
/// Added to a signal number: CMD was killed by it, or it interrupted a wait.
pub const EXIT_SIGNAL_BASE: Exit = 128;

/// The exit codes, as shown by `--help` (and in docs/cli.md).
pub const EXIT_CODES: &str = "\
Exit codes:
  0       Done: released/resigned after SIGINT, SIGTERM or SIGHUP; `elect --listen` stopped;
          `status` printed NAME's line (held or free); `top` quit (q, a signal) or printed
          --json; `barrier hold`/`release` done, or `barrier wait` saw the barrier released
  N       With CMD: CMD's own exit code, passed through
  1       Runtime error: cannot connect, etcd error, release failed, ...
  2       Bad arguments
  3       Lock or leadership lost (CMD, if any, was terminated)
  4       --timeout expired before the lock or leadership was acquired (`barrier wait`:
          before the barrier was released)
  126     CMD could not be executed
  127     CMD was not found
  128+N   CMD was killed by signal N (e.g. 137 = SIGKILL), or signal N interrupted the
          wait for the lock, leadership or barrier (130 = SIGINT, 143 = SIGTERM); no key
          is left
With CMD, codes 1-4 can also be CMD's own: etcd-sync reports its own failures on stderr.";

/// Where a subcommand's `--help` points for the exit codes (listed once, in the top-level
/// help).
pub const SEE_EXIT_CODES: &str = "Exit codes: see `etcd-sync --help`.";

/// Prints a library error and returns its exit code: 2 for an argument the library
/// refused (a malformed endpoint, a zero or too long duration, an empty or too long name),
/// 1 for everything else.
pub fn fail(e: &Error) -> Exit {
    if let Error::InvalidArgument(_) = e {
        eprintln!("etcd-sync: {}", in_flags(&e.to_string()));
        return EXIT_USAGE;
    }
    match e {
        // The library's message names its own API; say it in this tool's flags.
        Error::ClientCertificateRejected { endpoint, detail } => eprintln!(
            "etcd-sync: etcd at {endpoint} requires a TLS client certificate signed by its CA \
             and refused ours (none was given, or it is not trusted); pass --cert FILE \
             --key FILE [{detail}]"
        ),
        _ => eprintln!("etcd-sync: {}", in_flags(&e.to_string())),
    }
    EXIT_ERROR
}

/// The library's advice, which names its API (`ClientBuilder::tls`), in this tool's flags
/// (`--cacert`).
const IN_FLAGS: &[(&str, &str)] = &[
    (
        "(ClientBuilder::tls, cargo feature `tls`)",
        "(pass --cacert FILE, the CA that signed etcd's certificate)",
    ),
    ("with TlsConfig::ca_certificate_pem,", "with --cacert FILE,"),
    (
        "(TlsConfig::ca_certificate_pem or from_files)",
        "(--cacert FILE)",
    ),
    (
        "(ClientBuilder::user)",
        "(--user NAME:PASSWORD, or --user NAME and ETCD_SYNC_PASSWORD)",
    ),
    (
        "An etcd started without --cert-file speaks plain http://)",
        "An etcd started without --cert-file speaks plain http://: drop --cacert, with which \
         etcd-sync speaks only https)",
    ),
    ("cannot read CA certificate ", "cannot read --cacert "),
    ("cannot read client certificate ", "cannot read --cert "),
    ("cannot read client key ", "cannot read --key "),
    (
        ": expected a https:// URL",
        ": expected a https:// URL (--cacert turns on TLS for every endpoint)",
    ),
];

/// A prefix said twice (or more) by nested transport errors.
const DOUBLED: &str = "transport error: transport error";

/// `message` with [`IN_FLAGS`] applied and a repeated "transport error: " said once; a
/// TLS handshake that failed is not asked "is etcd
/// running" but whether it serves TLS.
fn in_flags(message: &str) -> String {
    let mut out = message.to_string();
    for (library, ours) in IN_FLAGS {
        out = out.replace(library, ours);
    }
    while out.contains(DOUBLED) {
        out = out.replace(DOUBLED, "transport error");
    }
    // etcd with auth on, asked by no user, after the connect (etcd 3.4 answers the
    // connect's probe without one).
    if out.ends_with("user name is empty") {
        out.push_str(" (etcd has authentication on: pass --user NAME:PASSWORD, or --user NAME and ETCD_SYNC_PASSWORD)");
    }
    if out.contains("tls handshake") {
        out = out.replace(
            "(is etcd running and listening there?)",
            "(does etcd serve TLS there? With --cacert, etcd-sync speaks only https)",
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_librarys_advice_in_flags() {
        let cases = [
            (
                "invalid argument: endpoint \"https://h:2379\" is https:// but no TLS settings were \
                 given (ClientBuilder::tls, cargo feature `tls`)",
                "invalid argument: endpoint \"https://h:2379\" is https:// but no TLS settings were \
                 given (pass --cacert FILE, the CA that signed etcd's certificate)",
            ),
            (
                "invalid argument: cannot read CA certificate /x: No such file",
                "invalid argument: cannot read --cacert /x: No such file",
            ),
            (
                "could not connect to etcd at http://h:1: transport error: transport error: \
                 transport error: tcp connect error",
                "could not connect to etcd at http://h:1: transport error: tcp connect error",
            ),
            (
                "could not connect to etcd at https://h:1: transport error: tls handshake eof \
                 (is etcd running and listening there?)",
                "could not connect to etcd at https://h:1: transport error: tls handshake eof \
                 (does etcd serve TLS there? With --cacert, etcd-sync speaks only https)",
            ),
            (
                "could not connect to etcd at https://h:1: TLS handshake failed: tls handshake \
                 eof (does etcd serve TLS there? An etcd started without --cert-file speaks \
                 plain http://)",
                "could not connect to etcd at https://h:1: TLS handshake failed: tls handshake \
                 eof (does etcd serve TLS there? An etcd started without --cert-file speaks \
                 plain http://: drop --cacert, with which etcd-sync speaks only https)",
            ),
        ];
        for (library, ours) in cases {
            assert_eq!(in_flags(library), ours);
        }
        for (library, _) in IN_FLAGS {
            assert!(!in_flags(library).contains("ClientBuilder::"), "{library}");
            assert!(!in_flags(library).contains("TlsConfig::"), "{library}");
        }
    }
}
