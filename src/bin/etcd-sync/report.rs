//! While a wait goes on, say what it waits for: after [`FIRST`] and then every [`EVERY`],
//! one line on stderr (who holds the name, how many keys are ahead of ours), unless
//! `--quiet`. A side thread does it, with one status read per line; the wait itself is
//! not touched. Dropping the [`Reporter`] stops it: no line is printed after the drop
//! (the line is printed under the same lock the drop takes).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use etcd_sync::{Client, Holder, Session, Status};

use crate::status::NO_IDENTITY;

/// How long a wait goes on before the first line.
pub const FIRST: Duration = Duration::from_secs(3);
/// How often a line is printed after the first.
pub const EVERY: Duration = Duration::from_secs(10);

/// The reporting side thread of one wait; dropping it stops the reports.
pub struct Reporter {
    shared: Arc<Shared>,
}

struct Shared {
    /// True while the wait goes on.
    active: Mutex<bool>,
    /// Wakes the thread when the wait ends.
    ended: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, bool> {
        self.active.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Reporter {
    /// Starts reporting: `describe(waited)` makes the line (without the `etcd-sync: `
    /// prefix) from one read, or `None` to say nothing this time. `None` if `quiet` (or if
    /// no thread could be started: the wait goes on silently).
    pub fn start(
        quiet: bool,
        describe: impl FnMut(Duration) -> Option<String> + Send + 'static,
    ) -> Option<Reporter> {
        if quiet {
            return None;
        }
        let shared = Arc::new(Shared {
            active: Mutex::new(true),
            ended: Condvar::new(),
        });
        let theirs = shared.clone();
        thread::Builder::new()
            .name("etcd-sync-report".into())
            .spawn(move || report(&theirs, describe))
            .ok()?;
        Some(Reporter { shared })
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        *self.shared.lock() = false;
        self.shared.ended.notify_all();
    }
}

fn report(shared: &Shared, mut describe: impl FnMut(Duration) -> Option<String>) {
    let started = Instant::now();
    let mut next = started + FIRST;
    loop {
        {
            let active = shared.lock();
            let wait = next.saturating_duration_since(Instant::now());
            let (active, _) = shared
                .ended
                .wait_timeout_while(active, wait, |active| *active && Instant::now() < next)
                .unwrap_or_else(PoisonError::into_inner);
            if !*active {
                return;
            }
        }
        // The read runs without the lock: the wait may end meanwhile.
        let line = describe(started.elapsed());
        let active = shared.lock();
        if !*active {
            return;
        }
        if let Some(line) = line {
            eprintln!("etcd-sync: {line}");
        }
        drop(active);
        next += EVERY;
    }
}

/// What a wait for the lock, semaphore, read-write lock or election `name` of `session`
/// waits for, from one `Client::status` read.
pub fn line_waiter(
    session: &Session,
    name: &str,
) -> impl FnMut(Duration) -> Option<String> + Send + 'static {
    let client = session.client().clone();
    let lease = session.lease_id();
    let name = name.to_string();
    move |waited| match client.status(&name) {
        Ok(status) => line_report(&name, waited, &status, lease),
        Err(e) => Some(format!(
            "waiting for {name:?} for {}; cannot read who holds it: {e}",
            seconds(waited)
        )),
    }
}

/// The line for a wait of `waited` whose key is bound to `lease`; `None` once our key
/// holds (the wait is about to return).
pub fn line_report(name: &str, waited: Duration, status: &Status, lease: i64) -> Option<String> {
    let line: Vec<&Holder> = status.holders.iter().chain(&status.waiters).collect();
    let ours = line.iter().position(|key| key.lease == lease);
    if ours.is_some_and(|at| at < status.holders.len()) {
        return None;
    }
    // Not in the line yet (still enqueueing): everyone is ahead.
    let ahead = ours.unwrap_or(line.len());
    let waited = seconds(waited);
    let held = match status.holders.as_slice() {
        [] => "nobody holds it at this moment (it is changing hands)".to_string(),
        [one] => format!("held by {}", holder(one)),
        [first, rest @ ..] => format!("held by {} and {} more", holder(first), rest.len()),
    };
    Some(format!(
        "waiting for {name:?} for {waited}: {held}; {ahead} ahead"
    ))
}

/// What a wait for the barrier `name` waits for: who raised it, from one read.
pub fn barrier_waiter(
    client: &Client,
    name: &str,
) -> impl FnMut(Duration) -> Option<String> + Send + 'static {
    let client = client.clone();
    let name = name.to_string();
    move |waited| {
        let waited = seconds(waited);
        Some(match client.get(&name) {
            Ok(Some(kv)) if kv.value.is_empty() => {
                format!("waiting for the barrier {name:?} for {waited}: raised")
            }
            Ok(Some(kv)) => format!(
                "waiting for the barrier {name:?} for {waited}: raised by {}",
                kv.value_str()
            ),
            // Released just now: the wait returns on its own.
            Ok(None) => return None,
            Err(e) => format!("waiting for the barrier {name:?} for {waited}; cannot read it: {e}"),
        })
    }
}

/// `IDENTITY (lease HEX, ttl Ns)`.
fn holder(key: &Holder) -> String {
    let identity = key.identity();
    let identity = identity.as_deref().unwrap_or(NO_IDENTITY);
    let ttl = key
        .ttl
        .map_or_else(|| "none".into(), |ttl| format!("{}s", ttl.as_secs()));
    if key.lease == 0 {
        format!("{identity} (no lease)")
    } else {
        format!("{identity} (lease {:x}, ttl {ttl})", key.lease)
    }
}

/// Whole seconds, as `12s`.
fn seconds(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_sync::KeyMode;

    fn key(value: &str, lease: i64, rev: i64) -> Holder {
        Holder {
            key: format!("busy/{lease:x}").into_bytes(),
            value: value.as_bytes().to_vec(),
            lease,
            create_revision: rev,
            mod_revision: rev,
            mode: KeyMode::Exclusive,
            ttl: Some(Duration::from_secs(9)),
        }
    }

    fn status(holders: Vec<Holder>, waiters: Vec<Holder>) -> Status {
        Status {
            name: b"busy".to_vec(),
            holders,
            waiters,
            revision: 20,
        }
    }

    #[test]
    fn says_who_holds_and_how_many_are_ahead() {
        let line = status(
            vec![key("holder-A", 0x694d, 5)],
            vec![key("", 0x694e, 6), key("me", 0x694f, 7)],
        );
        let twelve = Duration::from_millis(12_400);
        assert_eq!(
            line_report("busy", twelve, &line, 0x694f).as_deref(),
            Some("waiting for \"busy\" for 12s: held by holder-A (lease 694d, ttl 9s); 2 ahead")
        );
        // Not enqueued yet: everyone is ahead.
        assert_eq!(
            line_report("busy", twelve, &line, 0x7000).as_deref(),
            Some("waiting for \"busy\" for 12s: held by holder-A (lease 694d, ttl 9s); 3 ahead")
        );
        // Ours holds: nothing to say.
        assert_eq!(line_report("busy", twelve, &line, 0x694d), None);
        let shared = status(
            vec![key("", 0x10, 1), key("b", 0x11, 2)],
            vec![key("me", 0x12, 3)],
        );
        assert_eq!(
            line_report("busy", FIRST, &shared, 0x12).as_deref(),
            Some(
                "waiting for \"busy\" for 3s: held by (none: etcdctl or Go) (lease 10, ttl 9s) \
                 and 1 more; 2 ahead"
            )
        );
        let free = status(vec![], vec![]);
        assert_eq!(
            line_report("busy", FIRST, &free, 0x12).as_deref(),
            Some(
                "waiting for \"busy\" for 3s: nobody holds it at this moment (it is changing hands); 0 ahead"
            )
        );
    }

    #[test]
    fn nothing_after_the_drop() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let reporter = Reporter::start(false, move |_| {
            let _ = tx.send(());
            None
        });
        assert!(reporter.is_some());
        drop(reporter);
        assert!(rx.recv_timeout(FIRST + Duration::from_millis(500)).is_err());
        assert!(Reporter::start(true, |_| None).is_none());
    }
}
