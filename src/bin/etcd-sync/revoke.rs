//! `etcd-sync revoke NAME`: the library's `Client::request_release` for operators. Asks
//! every holder of NAME to let go and prints whom it asked; takes no lease.

use std::io::{self, Write};

use etcd_sync::{Client, Holder};

use crate::args::RevokeArgs;
use crate::exit::{EXIT_ERROR, EXIT_OK, EXIT_SIGNAL_BASE, Exit, fail};
use crate::wait::{Waited, interruptible};

/// Asks the holders of `args.name`: one line per holder asked, or `NAME: not held`.
pub fn revoke(client: &Client, args: &RevokeArgs) -> Exit {
    let client = client.clone();
    let (name, reason) = (args.name.clone(), args.reason.clone());
    let asked = interruptible(move || match &reason {
        Some(reason) => client.request_release_with_reason(&name, reason),
        None => client.request_release(&name),
    });
    let holders = match asked {
        Ok(Waited::Done(Ok(holders))) => holders,
        Ok(Waited::Done(Err(e))) => return fail(&e),
        Ok(Waited::Signal(signo)) => return EXIT_SIGNAL_BASE + signo,
        Err(code) => return code,
    };
    let lines: Vec<String> = match holders.is_empty() {
        true => vec![format!("{}: not held", args.name)],
        false => holders.iter().map(|h| line(&args.name, h)).collect(),
    };
    let mut out = io::stdout().lock();
    for line in lines {
        if let Err(e) = writeln!(out, "{line}") {
            eprintln!("etcd-sync: cannot write to stdout: {e}");
            return EXIT_ERROR;
        }
    }
    EXIT_OK
}

/// `NAME: asked KEY (IDENTITY)`; a holder without an identity (etcdctl, Go) says so.
fn line(name: &str, holder: &Holder) -> String {
    let identity = holder.identity().map_or_else(
        || "no identity: etcdctl or Go, which never look".into(),
        |i| i.into_owned(),
    );
    format!("{name}: asked {} ({identity})", holder.key_str())
}
