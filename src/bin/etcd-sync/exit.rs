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
          `status` printed NAME's line (held or free); `barrier hold`/`release` done, or
          `barrier wait` saw the barrier released
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
        eprintln!("etcd-sync: {e}");
        return EXIT_USAGE;
    }
    match e {
        // The library's message names its own API; say it in this tool's flags.
        Error::ClientCertificateRejected { endpoint, detail } => eprintln!(
            "etcd-sync: etcd at {endpoint} requires a TLS client certificate signed by its CA \
             and refused ours (none was given, or it is not trusted); pass --cert FILE \
             --key FILE [{detail}]"
        ),
        _ => eprintln!("etcd-sync: {e}"),
    }
    EXIT_ERROR
}
