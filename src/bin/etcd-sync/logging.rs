//! The library's own events (`tracing`) on stderr, when asked: `-v`/`--log-level` for the
//! `etcd_sync` target, `RUST_LOG` for anything (tracing-subscriber's directives). Only
//! this binary reads `RUST_LOG`; the library reads no environment variable.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;

/// The level `-v` given `count` times asks for, if any.
fn verbosity(count: u8) -> Option<&'static str> {
    match count {
        0 => None,
        1 => Some("info"),
        2 => Some("debug"),
        _ => Some("trace"),
    }
}

/// Installs a subscriber writing to stderr if `--log-level`, `-v` or `RUST_LOG` asks for
/// events; otherwise none (no event is even formatted). `--log-level` wins over `-v`;
/// either sets the level of `etcd_sync`'s events on top of `RUST_LOG`'s directives.
pub fn init(log_level: Option<&str>, verbose: u8) {
    let level = log_level.or_else(|| verbosity(verbose));
    let rust_log = std::env::var("RUST_LOG")
        .ok()
        .filter(|spec| !spec.trim().is_empty());
    if level.is_none() && rust_log.is_none() {
        return;
    }
    let builder = EnvFilter::builder().with_default_directive(LevelFilter::OFF.into());
    let mut filter = match rust_log.as_deref().map(|spec| builder.clone().parse(spec)) {
        None => builder.parse_lossy(""),
        Some(Ok(filter)) => filter,
        Some(Err(e)) => {
            eprintln!("etcd-sync: RUST_LOG: {e}; ignoring what cannot be read");
            builder.parse_lossy(rust_log.as_deref().unwrap_or_default())
        }
    };
    if let Some(level) = level {
        match format!("etcd_sync={level}").parse() {
            Ok(directive) => filter = filter.add_directive(directive),
            Err(e) => eprintln!("etcd-sync: --log-level {level}: {e}"),
        }
    }
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .finish();
    if let Err(e) = tracing::subscriber::set_global_default(subscriber) {
        eprintln!("etcd-sync: cannot log: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_v_is_one_level_more() {
        assert_eq!(verbosity(0), None);
        assert_eq!(verbosity(1), Some("info"));
        assert_eq!(verbosity(2), Some("debug"));
        assert_eq!(verbosity(3), Some("trace"));
        assert_eq!(verbosity(9), Some("trace"));
    }
}
