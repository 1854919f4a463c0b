//! `etcd-sync status NAME [--json]`: who holds a name and who waits, from
//! `Client::status` (one read, no session). The output formats are documented in
//! `args::STATUS_ABOUT`; the JSON one is stable: [`StatusJson`] and [`KeyJson`] fix its
//! fields and their order.

use std::fmt::Write as _;
use std::io::{self, Write};

use etcd_sync::{Client, Holder, KeyMode, Status};
use serde::Serialize;

use crate::args::StatusArgs;
use crate::exit::{EXIT_ERROR, EXIT_OK, EXIT_SIGNAL_BASE, Exit, fail};
use crate::wait::{Waited, interruptible};

/// What the human form shows for a key with an empty value: `etcdctl lock` and Go's
/// `Mutex` store none.
pub const NO_IDENTITY: &str = "(none: etcdctl or Go)";

/// Reads NAME's line and prints it; 0 whether or not it is held.
pub fn status(client: &Client, args: &StatusArgs) -> Exit {
    let (client, name) = (client.clone(), args.name.clone());
    let status = match interruptible(move || client.status(name)) {
        Ok(Waited::Done(Ok(status))) => status,
        Ok(Waited::Done(Err(e))) => return fail(&e),
        Ok(Waited::Signal(signo)) => return EXIT_SIGNAL_BASE + signo,
        Err(code) => return code,
    };
    let text = if args.json {
        match json(&status) {
            Ok(text) => text,
            Err(e) => {
                eprintln!("etcd-sync: cannot write the status as JSON: {e}");
                return EXIT_ERROR;
            }
        }
    } else {
        human(&status)
    };
    print(&text)
}

/// The human form: a summary line, then one line per key in line order.
pub fn human(status: &Status) -> String {
    let name = status.name_str();
    let mut out = if status.is_held() {
        format!(
            "{name}: held by {}, {} waiting",
            status.holders.len(),
            status.waiters.len()
        )
    } else {
        format!("{name}: free")
    };
    let keys = status.holders.iter().map(|h| ("holder", h));
    for (role, key) in keys.chain(status.waiters.iter().map(|w| ("waiter", w))) {
        let identity = key.identity();
        let _ = write!(
            out,
            "\n{role}  {}  {}  lease {}  token {}  ttl {}",
            key.key_str(),
            identity.as_deref().unwrap_or(NO_IDENTITY),
            lease_hex(key).as_deref().unwrap_or("none"),
            key.create_revision,
            key.ttl
                .map_or_else(|| "none".into(), |ttl| format!("{}s", ttl.as_secs())),
        );
        match key.mode {
            KeyMode::Exclusive => {}
            KeyMode::Shared => out.push_str("  shared"),
            KeyMode::Permits(n) => {
                let _ = write!(out, "  permits {n}");
                if let Some(k) = key.num_permits().filter(|&k| k > 1) {
                    let _ = write!(out, "  takes {k}");
                }
            }
            KeyMode::Other => out.push_str("  not a lock key"),
        }
    }
    out
}

/// The JSON form: `{"name":..,"holders":[..],"waiters":[..]}`.
pub fn json(status: &Status) -> serde_json::Result<String> {
    serde_json::to_string(&StatusJson::new(status))
}

/// `status --json`'s object (and each name's in `top --json`); fields serialize in
/// declaration order (the documented order).
#[derive(Serialize)]
pub struct StatusJson {
    name: String,
    holders: Vec<KeyJson>,
    waiters: Vec<KeyJson>,
}

impl StatusJson {
    pub fn new(status: &Status) -> StatusJson {
        StatusJson {
            name: status.name_str().into_owned(),
            holders: status.holders.iter().map(KeyJson::new).collect(),
            waiters: status.waiters.iter().map(KeyJson::new).collect(),
        }
    }
}

/// One key of `status --json`, in the documented field order.
#[derive(Serialize)]
struct KeyJson {
    key: String,
    identity: Option<String>,
    /// In hex, as in the key's name; `null` for a key without a lease.
    lease: Option<String>,
    /// The create revision (the fencing token).
    revision: i64,
    /// Seconds left; `null` without a lease.
    ttl: Option<u64>,
    mode: &'static str,
    /// Only for `"mode":"permits"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    permits: Option<u32>,
    /// Only for a key of several permits (`acquire_many`): how many it takes.
    #[serde(skip_serializing_if = "Option::is_none")]
    takes: Option<u32>,
}

impl KeyJson {
    fn new(key: &Holder) -> KeyJson {
        let (mode, permits) = match key.mode {
            KeyMode::Exclusive => ("exclusive", None),
            KeyMode::Shared => ("shared", None),
            KeyMode::Permits(n) => ("permits", Some(n)),
            KeyMode::Other => ("other", None),
        };
        KeyJson {
            key: key.key_str().into_owned(),
            identity: key.identity().map(|identity| identity.into_owned()),
            lease: lease_hex(key),
            revision: key.create_revision,
            ttl: key.ttl.map(|ttl| ttl.as_secs()),
            mode,
            permits,
            takes: key.num_permits().filter(|&k| k > 1),
        }
    }
}

/// The key's lease in hex, as in its name; `None` for a key without a lease.
fn lease_hex(key: &Holder) -> Option<String> {
    (key.lease != 0).then(|| format!("{:x}", key.lease))
}

/// Writes `text` and a newline to stdout: a closed pipe (`| head`) is no failure.
pub fn print(text: &str) -> Exit {
    let mut out = io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => EXIT_OK,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => EXIT_OK,
        Err(e) => {
            eprintln!("etcd-sync: cannot write to stdout: {e}");
            EXIT_ERROR
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(key: &str, value: &str, lease: i64, rev: i64, mode: KeyMode) -> Holder {
        Holder {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            lease,
            create_revision: rev,
            mod_revision: rev,
            mode,
            ttl: (lease != 0).then(|| Duration::from_secs(9)),
        }
    }

    fn line() -> Status {
        Status {
            name: b"jobs".to_vec(),
            holders: vec![key("jobs/694d", "host-a:42", 0x694d, 7, KeyMode::Exclusive)],
            waiters: vec![
                key("jobs/694e", "", 0x694e, 9, KeyMode::Exclusive),
                key(
                    "jobs/694f.permits-2",
                    "say \"hi\"",
                    0x694f,
                    11,
                    KeyMode::Permits(2),
                ),
                key("jobs/data", "x", 0, 12, KeyMode::Other),
                key(
                    "jobs/6950.permits-2.x2",
                    "",
                    0x6950,
                    13,
                    KeyMode::Permits(2),
                ),
            ],
            revision: 13,
        }
    }

    #[test]
    fn human_lines() {
        assert_eq!(
            human(&line()),
            "jobs: held by 1, 4 waiting\n\
             holder  jobs/694d  host-a:42  lease 694d  token 7  ttl 9s\n\
             waiter  jobs/694e  (none: etcdctl or Go)  lease 694e  token 9  ttl 9s\n\
             waiter  jobs/694f.permits-2  say \"hi\"  lease 694f  token 11  ttl 9s  permits 2\n\
             waiter  jobs/data  x  lease none  token 12  ttl none  not a lock key\n\
             waiter  jobs/6950.permits-2.x2  (none: etcdctl or Go)  lease 6950  token 13  ttl 9s  permits 2  takes 2"
        );
        let free = Status {
            holders: vec![],
            waiters: vec![],
            ..line()
        };
        assert_eq!(human(&free), "jobs: free");
    }

    #[test]
    fn json_object() {
        assert_eq!(
            json(&line()).unwrap(),
            concat!(
                r#"{"name":"jobs","holders":[{"key":"jobs/694d","identity":"host-a:42","lease":"694d","revision":7,"ttl":9,"mode":"exclusive"}],"#,
                r#""waiters":[{"key":"jobs/694e","identity":null,"lease":"694e","revision":9,"ttl":9,"mode":"exclusive"},"#,
                r#"{"key":"jobs/694f.permits-2","identity":"say \"hi\"","lease":"694f","revision":11,"ttl":9,"mode":"permits","permits":2},"#,
                r#"{"key":"jobs/data","identity":"x","lease":null,"revision":12,"ttl":null,"mode":"other"},"#,
                r#"{"key":"jobs/6950.permits-2.x2","identity":null,"lease":"6950","revision":13,"ttl":9,"mode":"permits","permits":2,"takes":2}]}"#
            )
        );
        let free = Status {
            holders: vec![],
            waiters: vec![],
            ..line()
        };
        assert_eq!(
            json(&free).unwrap(),
            r#"{"name":"jobs","holders":[],"waiters":[]}"#
        );
    }
}
