//! Fenced torture checker: child processes × threads contend on one lock on a real 3-member
//! cluster while the parent SIGKILLs clients and kills or pauses etcd members at random.
//! Every critical section stamps guarded writes with its fencing token and logs
//! (token, holder, enter, last-confirmed, write revisions); afterwards a checker verifies:
//!
//! * no two critical sections overlap, in token order, on the machine-wide monotonic clock
//!   (a section counts from `lock()` returning to the last instant `is_held()` confirmed it);
//! * etcd accepted every section's writes strictly in token order (by revision);
//! * every write attempted with a released (stale) guard's condition was rejected;
//! * no lock key is left behind once the clients are gone.
//!
//! Bounded: `TORTURE_SECS` (default 60) of chaos, everything on 127.0.0.1, every process
//! started is killed at the end.

#![cfg(feature = "testing")]

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use common::{CHILD_ROLE, ChildGuard, eventually, keys, monotonic_ns, spawn_child};
use etcd_sync::testing::EtcdCluster;
use etcd_sync::{Client, Txn, TxnOp};

const PROCESSES: usize = 3;
const THREADS: usize = 3;
const NAME: &str = "torture";

/// A small xorshift generator: reproducible from its seed, no extra crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn client_for(endpoints: &[String]) -> etcd_sync::Result<Client> {
    Client::builder()
        .endpoints(endpoints)
        .request_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(1))
        .connect()
}

/// Child-process entry point: worker threads contending until the deadline.
#[test]
fn torture_child() {
    let Ok(role) = std::env::var(CHILD_ROLE) else {
        return;
    };
    assert_eq!(role, "worker");
    let mut endpoints: Vec<String> = std::env::var("ENDPOINTS")
        .unwrap()
        .split(',')
        .map(String::from)
        .collect();
    let deadline_ns: u64 = std::env::var("DEADLINE_NS").unwrap().parse().unwrap();
    let log_path = std::env::var("LOG").unwrap();
    let seed = std::process::id() as u64 | 1;
    endpoints.rotate_left((seed % 3) as usize);
    let Ok(client) = client_for(&endpoints) else {
        return;
    };
    let log = std::sync::Arc::new(std::sync::Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .unwrap(),
    ));
    let threads: Vec<_> = (0..THREADS)
        .map(|tid| {
            let (client, log) = (client.clone(), log.clone());
            std::thread::spawn(move || worker(client, log, tid, deadline_ns, seed + tid as u64))
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

fn worker(
    client: Client,
    log: std::sync::Arc<std::sync::Mutex<std::fs::File>>,
    tid: usize,
    deadline_ns: u64,
    seed: u64,
) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let pid = std::process::id();
    let write = |line: String| {
        let mut f = log.lock().unwrap();
        let _ = writeln!(f, "{line}");
        let _ = f.flush();
    };
    while monotonic_ns() < deadline_ns {
        let Ok(session) = client.session_builder().ttl(Duration::from_secs(3)).start() else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let Ok(mutex) = session.mutex(NAME) else {
            return;
        };
        while monotonic_ns() < deadline_ns && session.is_alive() {
            let Ok(guard) = mutex.lock_timeout(Duration::from_secs(3)) else {
                continue;
            };
            let enter = monotonic_ns();
            let token = guard.fencing_token();
            let (mut ok, mut rejected, mut first_rev, mut last_rev) = (0, 0, 0i64, 0i64);
            let mut confirmed = enter;
            for _ in 0..2 {
                let stamp = format!("{token}:{pid}:{tid}");
                match guard.put("torture-data", stamp) {
                    Ok(r) => {
                        ok += 1;
                        if first_rev == 0 {
                            first_rev = r.revision;
                        }
                        last_rev = r.revision;
                    }
                    Err(_) => rejected += 1,
                }
                std::thread::sleep(Duration::from_millis(rng.below(15)));
                let before = monotonic_ns();
                if !guard.is_held() {
                    break;
                }
                confirmed = before;
            }
            let ownership = guard.ownership_compare();
            write(format!(
                "CS {token} {pid}:{tid} {enter} {confirmed} {ok} {rejected} {first_rev} {last_rev}"
            ));
            drop(guard);
            // A write under the released guard's condition must never be accepted.
            if let Ok(r) = client.txn(
                Txn::new()
                    .when([ownership])
                    .and_then([TxnOp::put("torture-stale", "x")]),
            ) {
                write(format!("STALE {token} {}", u8::from(r.succeeded)));
            }
        }
    }
}

#[derive(Debug)]
struct Section {
    token: i64,
    holder: String,
    enter: u64,
    confirmed: u64,
    accepted: u64,
    rejected: u64,
    first_rev: i64,
    last_rev: i64,
}

#[test]
fn fenced_torture() {
    if std::env::var(CHILD_ROLE).is_ok() {
        return;
    }
    let secs: u64 = std::env::var("TORTURE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let cluster = EtcdCluster::start(3).expect("start a 3-member cluster");
    let endpoints = cluster.endpoints();
    let dir = std::env::temp_dir().join(format!("etcd-sync-torture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let deadline_ns = monotonic_ns() + secs * 1_000_000_000;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let spawn = |n: usize| {
        ChildGuard(Some(spawn_child(
            "torture_child",
            "worker",
            &[
                ("ENDPOINTS", endpoints.join(",")),
                ("DEADLINE_NS", deadline_ns.to_string()),
                ("LOG", dir.join(format!("log-{n}")).display().to_string()),
            ],
        )))
    };
    let mut spawned = 0;
    let mut children: Vec<ChildGuard> = (0..PROCESSES)
        .map(|_| {
            spawned += 1;
            spawn(spawned)
        })
        .collect();
    let mut rng = Rng(monotonic_ns() | 1);
    let (mut client_kills, mut member_kills, mut member_pauses) = (0, 0, 0);
    while Instant::now() + Duration::from_secs(4) < deadline {
        std::thread::sleep(Duration::from_millis(1500 + rng.below(1500)));
        match rng.below(3) {
            0 => {
                let victim = rng.below(PROCESSES as u64) as usize;
                children[victim].kill(); // SIGKILL
                client_kills += 1;
                spawned += 1;
                children[victim] = spawn(spawned);
            }
            1 => {
                let member = rng.below(3) as usize;
                cluster.kill(member).unwrap();
                member_kills += 1;
                std::thread::sleep(Duration::from_millis(500 + rng.below(1500)));
                cluster.restart(member).unwrap();
            }
            _ => {
                let member = rng.below(3) as usize;
                cluster.pause(member).unwrap();
                member_pauses += 1;
                std::thread::sleep(Duration::from_millis(500 + rng.below(2500)));
                cluster.resume(member).unwrap();
            }
        }
    }
    // Children stop by themselves at the deadline; bound the wait anyway.
    let stop_by = deadline + Duration::from_secs(15);
    for child in &mut children {
        while Instant::now() < stop_by && child.child().try_wait().ok().flatten().is_none() {
            std::thread::sleep(Duration::from_millis(50));
        }
        child.kill();
    }
    cluster.wait_healthy(Duration::from_secs(30)).unwrap();

    // Collect and check.
    let mut sections = Vec::new();
    let (mut stale_attempts, mut stale_accepted) = (0, 0);
    for n in 1..=spawned {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("log-{n}"))) else {
            continue;
        };
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            match f.first() {
                Some(&"CS") if f.len() == 9 => sections.push(Section {
                    token: f[1].parse().unwrap(),
                    holder: f[2].to_string(),
                    enter: f[3].parse().unwrap(),
                    confirmed: f[4].parse().unwrap(),
                    accepted: f[5].parse().unwrap(),
                    rejected: f[6].parse().unwrap(),
                    first_rev: f[7].parse().unwrap(),
                    last_rev: f[8].parse().unwrap(),
                }),
                Some(&"STALE") if f.len() == 3 => {
                    stale_attempts += 1;
                    stale_accepted += usize::from(f[2] == "1");
                }
                _ => {} // a line cut by SIGKILL
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    sections.sort_by_key(|s| s.token);
    let mut violations = Vec::new();
    let mut seen = HashMap::new();
    for s in &sections {
        if let Some(other) = seen.insert(s.token, s.holder.clone()) {
            violations.push(format!(
                "token {} held by {} and {}",
                s.token, other, s.holder
            ));
        }
    }
    for pair in sections.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if b.enter < a.confirmed {
            violations.push(format!(
                "section {} ({}) still confirmed {} µs after section {} ({}) entered",
                a.token,
                a.holder,
                (a.confirmed - b.enter) / 1000,
                b.token,
                b.holder
            ));
        }
    }
    let mut last_accepted: Option<&Section> = None;
    for s in sections.iter().filter(|s| s.accepted > 0) {
        if let Some(prev) = last_accepted
            && prev.last_rev >= s.first_rev
        {
            violations.push(format!(
                "writes of token {} (rev {}) not before writes of token {} (rev {})",
                prev.token, prev.last_rev, s.token, s.first_rev
            ));
        }
        last_accepted = Some(s);
    }
    if stale_accepted > 0 {
        violations.push(format!("{stale_accepted} stale writes accepted"));
    }
    let c = client_for(&endpoints).unwrap();
    let leftover_free = eventually(Duration::from_secs(10), || {
        keys(&c, &format!("{NAME}/")).is_empty()
    });
    if !leftover_free {
        violations.push(format!(
            "keys left behind: {:?}",
            keys(&c, &format!("{NAME}/"))
        ));
    }
    let rejected: u64 = sections.iter().map(|s| s.rejected).sum();
    println!(
        "TORTURE secs={secs} processes={PROCESSES}x{THREADS} acquisitions={} client_kills={client_kills} \
         member_kills={member_kills} member_pauses={member_pauses} stale_writes_rejected={}/{} \
         guarded_writes_rejected={rejected} violations={}",
        sections.len(),
        stale_attempts - stale_accepted,
        stale_attempts,
        violations.len()
    );
    assert!(
        violations.is_empty(),
        "violations:\n{}",
        violations.join("\n")
    );
    assert!(
        sections.len() > 20,
        "too little progress: {} acquisitions",
        sections.len()
    );
}
