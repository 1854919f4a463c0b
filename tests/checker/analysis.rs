//! Reads the children's logs and checks them: intervals, write order, stale writes, wait
//! bounds (see the checks listed in `main.rs`).

use std::collections::HashMap;

use super::REQUEST_TIMEOUT;

#[derive(Debug)]
pub(crate) struct Section {
    /// `x` exclusive, `s` shared (a read lock), `pN` a permit of N.
    pub(crate) mode: String,
    pub(crate) token: i64,
    pub(crate) holder: String,
    pub(crate) enter: u64,
    pub(crate) confirmed: u64,
    pub(crate) accepted: u64,
    pub(crate) rejected: u64,
    pub(crate) first_rev: i64,
    pub(crate) last_rev: i64,
    /// The guard's key in etcd.
    pub(crate) key: String,
    /// When the worker stopped holding it (before its release).
    pub(crate) held_until: u64,
    /// When the worker saw it lost (`lost()` fired or `is_held()` said no); 0 if it did not.
    pub(crate) lost_at: u64,
    /// When its release (unlock, drop, or the re-campaign that superseded it) returned.
    pub(crate) released_at: u64,
    /// How it ended: `unlock`, `unlock_err`, `drop`, `recamp` (a re-campaign), `downgrade` (a write
    /// that went on as a read), `handover` (a leadership handed to a waiting candidate).
    pub(crate) how: String,
    /// Its key's create revision: the token, but for a leadership handed over to it (the
    /// old leader's key).
    pub(crate) rev: i64,
}

#[derive(Default)]
pub(crate) struct Totals {
    pub(crate) sections: HashMap<String, Vec<Section>>,
    pub(crate) stale_attempts: u64,
    pub(crate) stale_accepted: u64,
    pub(crate) waits: u64,
    pub(crate) slow_waits: Vec<String>,
    /// The most any timed wait ran past its limit, in ms: how close the runs come to the
    /// bound (the limit plus two request timeouts).
    pub(crate) max_overrun_ms: u64,
    pub(crate) errors: HashMap<String, u64>,
    /// The text of every error of no known kind, for the summary.
    pub(crate) other_errors: Vec<String>,
    /// How many children waited with each line tuning (`TUNING front far_start
    /// poll_near`), to show the tuning reached them.
    pub(crate) tunings: std::collections::BTreeMap<String, u64>,
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
                (Some(&"CS"), 16 | 17) => {
                    let parsed = (|| {
                        let token = f[3].parse().ok()?;
                        Some(Section {
                            mode: f[2].to_string(),
                            token,
                            holder: f[4].to_string(),
                            enter: f[5].parse().ok()?,
                            confirmed: f[6].parse().ok()?,
                            accepted: f[7].parse().ok()?,
                            rejected: f[8].parse().ok()?,
                            first_rev: f[9].parse().ok()?,
                            last_rev: f[10].parse().ok()?,
                            key: f[11].to_string(),
                            held_until: f[12].parse().ok()?,
                            lost_at: f[13].parse().ok()?,
                            released_at: f[14].parse().ok()?,
                            how: f[15].to_string(),
                            rev: f.get(16).map_or(Some(token), |r| r.parse().ok())?,
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
                    totals.max_overrun_ms = totals.max_overrun_ms.max(took.saturating_sub(timeout));
                    let bound = timeout + 2 * REQUEST_TIMEOUT.as_millis() as u64;
                    if took > bound {
                        totals.slow_waits.push(format!(
                            "a {timeout} ms wait took {took} ms (log-{n}, started at UNIX ms {})",
                            f[3]
                        ));
                    }
                }
                (Some(&"TUNING"), 4) => {
                    *totals.tunings.entry(f[1..].join("/")).or_default() += 1;
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

/// How many sections of `mode` may overlap: none for an exclusive one, any number of
/// shared ones, N permits of N.
fn shares_with(mode: &str) -> usize {
    match mode {
        "s" => usize::MAX,
        permits if permits.starts_with('p') => permits_of(permits).map_or(1, |(n, _)| n),
        _ => 1,
    }
}

/// `(N, k)` of a permit mode: `pN` is one permit of N, `pNxk` k of them at once.
pub(crate) fn permits_of(mode: &str) -> Option<(usize, usize)> {
    let rest = mode.strip_prefix('p')?;
    match rest.split_once('x') {
        Some((n, k)) => Some((n.parse().ok()?, k.parse().ok()?)),
        None => Some((rest.parse().ok()?, 1)),
    }
}

/// No two sessions hold one token; overlapping intervals only where the modes allow
/// (exclusive with nothing, shared with shared, at most N permits of N); exclusive
/// guards' writes land in token order.
pub(crate) fn check_name(name: &str, sections: &mut [Section], violations: &mut Vec<String>) {
    sections.sort_by_key(|s| (s.token, s.enter));
    for pair in sections.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        // One token under two guards is one hold handed over by a re-campaign: allowed
        // within one session (pid:session), and never at the same time (below).
        if a.token == b.token && session_of(&a.holder) != session_of(&b.holder) {
            violations.push(format!(
                "{name}: token {} held by {} and {}",
                a.token, a.holder, b.holder
            ));
        }
    }
    // Sweep in order of entry; `active` are the sections still confirmed at that instant.
    let mut order: Vec<&Section> = sections.iter().collect();
    order.sort_by_key(|s| s.enter);
    let mut active: Vec<&Section> = Vec::new();
    for s in order {
        active.retain(|a| a.confirmed > s.enter);
        for a in &active {
            let permits = |m: &str| permits_of(m).map(|(n, _)| n);
            let same_permits = permits(&a.mode).is_some() && permits(&a.mode) == permits(&s.mode);
            let allowed = (a.mode == s.mode || same_permits) && shares_with(&s.mode) > 1;
            if !allowed {
                violations.push(format!(
                    "{name}: {} token {} ({}) still confirmed {} µs after {} token {} ({}) entered",
                    a.mode,
                    a.token,
                    a.holder,
                    (a.confirmed - s.enter) / 1000,
                    s.mode,
                    s.token,
                    s.holder
                ));
            }
        }
        // Permits count by weight: k permits at once count k.
        let weight = |m: &str| permits_of(m).map_or(1, |(_, k)| k);
        let same: usize = active
            .iter()
            .filter(|a| {
                a.mode == s.mode
                    || (permits_of(&a.mode).is_some()
                        && shares_with(&a.mode) == shares_with(&s.mode)
                        && permits_of(&s.mode).is_some())
            })
            .map(|a| weight(&a.mode))
            .sum();
        if same + weight(&s.mode) > shares_with(&s.mode) && shares_with(&s.mode) > 1 {
            violations.push(format!(
                "{name}: {} holders of {} at once when token {} ({}) entered",
                same + 1,
                s.mode,
                s.token,
                s.holder
            ));
        }
        active.push(s);
    }
    let mut last: Option<&Section> = None;
    for s in sections.iter().filter(|s| s.accepted > 0 && s.mode == "x") {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn section(mode: &str, token: i64, enter: u64, confirmed: u64) -> Section {
        Section {
            mode: mode.into(),
            token,
            holder: format!("{token}:0:0"),
            enter,
            confirmed,
            accepted: 0,
            rejected: 0,
            first_rev: 0,
            last_rev: 0,
            key: format!("n/{token}"),
            held_until: confirmed,
            lost_at: 0,
            released_at: confirmed,
            how: "unlock".into(),
            rev: token,
        }
    }

    fn violations(mut sections: Vec<Section>) -> usize {
        let mut found = Vec::new();
        check_name("n", &mut sections, &mut found);
        found.len()
    }

    #[test]
    fn overlaps_are_judged_by_mode() {
        let readers = vec![section("s", 1, 0, 10), section("s", 2, 5, 20)];
        assert_eq!(violations(readers), 0);
        let reader_and_writer = vec![section("s", 1, 0, 10), section("x", 2, 5, 20)];
        assert_eq!(violations(reader_and_writer), 1);
        let two_of_two = vec![section("p2", 1, 0, 10), section("p2", 2, 5, 20)];
        assert_eq!(violations(two_of_two), 0);
        let three_of_two = vec![
            section("p2", 1, 0, 10),
            section("p2", 2, 5, 20),
            section("p2", 3, 6, 8),
        ];
        assert_eq!(violations(three_of_two), 1);
        let in_turn = vec![section("x", 1, 0, 10), section("x", 2, 10, 20)];
        assert_eq!(violations(in_turn), 0);
    }

    #[test]
    fn permits_taken_at_once_count_by_weight() {
        let both_then_one = vec![section("p2x2", 1, 0, 10), section("p2", 2, 5, 20)];
        assert!(violations(both_then_one) > 0);
        let one_then_both = vec![section("p2", 1, 0, 10), section("p2x2", 2, 5, 20)];
        assert!(violations(one_then_both) > 0);
        let in_turn = vec![section("p2x2", 1, 0, 10), section("p2", 2, 10, 20)];
        assert_eq!(violations(in_turn), 0);
        let beside_a_writer = vec![section("p2x2", 1, 0, 10), section("x", 2, 5, 20)];
        assert_eq!(violations(beside_a_writer), 1);
    }
}
