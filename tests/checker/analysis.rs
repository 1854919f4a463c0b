//! Reads the children's logs and checks them: intervals, write order, stale writes, wait
//! bounds (see the checks listed in `main.rs`).

use std::collections::HashMap;

use super::REQUEST_TIMEOUT;

#[derive(Debug)]
pub(crate) struct Section {
    pub(crate) token: i64,
    pub(crate) holder: String,
    pub(crate) enter: u64,
    pub(crate) confirmed: u64,
    pub(crate) accepted: u64,
    pub(crate) rejected: u64,
    pub(crate) first_rev: i64,
    pub(crate) last_rev: i64,
}

#[derive(Default)]
pub(crate) struct Totals {
    pub(crate) sections: HashMap<String, Vec<Section>>,
    pub(crate) stale_attempts: u64,
    pub(crate) stale_accepted: u64,
    pub(crate) waits: u64,
    pub(crate) slow_waits: Vec<String>,
    pub(crate) errors: HashMap<String, u64>,
    /// The text of every error of no known kind, for the summary.
    pub(crate) other_errors: Vec<String>,
}

pub(crate) fn parse_logs(dir: &std::path::Path, files: usize) -> Totals {
    let mut totals = Totals::default();
    for n in 1..=files {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("log-{n}"))) else {
            continue;
        };
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            match (f.first(), f.len()) {
                (Some(&"CS"), 10) => {
                    let parsed = (|| {
                        Some(Section {
                            token: f[2].parse().ok()?,
                            holder: f[3].to_string(),
                            enter: f[4].parse().ok()?,
                            confirmed: f[5].parse().ok()?,
                            accepted: f[6].parse().ok()?,
                            rejected: f[7].parse().ok()?,
                            first_rev: f[8].parse().ok()?,
                            last_rev: f[9].parse().ok()?,
                        })
                    })();
                    if let Some(section) = parsed {
                        totals
                            .sections
                            .entry(f[1].to_string())
                            .or_default()
                            .push(section);
                    }
                }
                (Some(&"STALE"), 3) => {
                    totals.stale_attempts += 1;
                    totals.stale_accepted += u64::from(f[2] == "1");
                }
                (Some(&"WAIT"), 4) => {
                    totals.waits += 1;
                    let (Ok(timeout), Ok(took)) = (f[1].parse::<u64>(), f[2].parse::<u64>()) else {
                        continue;
                    };
                    let bound = timeout + 2 * REQUEST_TIMEOUT.as_millis() as u64;
                    if took > bound {
                        totals.slow_waits.push(format!(
                            "a {timeout} ms wait took {took} ms (log-{n}, started at UNIX ms {})",
                            f[3]
                        ));
                    }
                }
                (Some(&"ERR"), 2) => *totals.errors.entry(f[1].to_string()).or_default() += 1,
                (Some(&"NOTE"), _) => totals
                    .other_errors
                    .push(line.get(5..).unwrap_or_default().to_string()),
                _ => {} // a line cut by SIGKILL
            }
        }
    }
    totals
}

/// `pid:session` of a `pid:session:thread` holder.
pub(crate) fn session_of(holder: &str) -> &str {
    holder
        .rsplit_once(':')
        .map_or(holder, |(session, _)| session)
}

/// Intervals never overlap in token order; writes land in token order.
pub(crate) fn check_name(name: &str, sections: &mut [Section], violations: &mut Vec<String>) {
    sections.sort_by_key(|s| (s.token, s.enter));
    for pair in sections.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        // One token under two guards is one hold handed over by a re-campaign: allowed
        // within one session (pid:session), and never at the same time.
        if a.token == b.token && session_of(&a.holder) != session_of(&b.holder) {
            violations.push(format!(
                "{name}: token {} held by {} and {}",
                a.token, a.holder, b.holder
            ));
        }
        if b.enter < a.confirmed {
            violations.push(format!(
                "{name}: token {} ({}) still confirmed {} µs after token {} ({}) entered",
                a.token,
                a.holder,
                (a.confirmed - b.enter) / 1000,
                b.token,
                b.holder
            ));
        }
    }
    let mut last: Option<&Section> = None;
    for s in sections.iter().filter(|s| s.accepted > 0) {
        if let Some(prev) = last
            && prev.token != s.token
            && prev.last_rev >= s.first_rev
        {
            violations.push(format!(
                "{name}: writes of token {} (rev {}) not before writes of token {} (rev {})",
                prev.token, prev.last_rev, s.token, s.first_rev
            ));
        }
        last = Some(s);
    }
}
