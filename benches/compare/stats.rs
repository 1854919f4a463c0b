//! Statistics and output: nearest-rank percentiles, the `RESULT` lines and the closing
//! human-readable summary.

use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub n: usize,
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

/// Nearest-rank percentiles (the same definition as benches/go/main.go), in microseconds.
fn stats(samples: &[Duration]) -> Option<Stats> {
    if samples.is_empty() {
        return None;
    }
    let mut s: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let rank = |p: f64| -> f64 {
        let idx = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
        s[idx]
    };
    Some(Stats {
        n,
        median: rank(0.50),
        p90: rank(0.90),
        p99: rank(0.99),
        mean: s.iter().sum::<f64>() / n as f64,
        min: s[0],
        max: s[n - 1],
    })
}

/// Prints the `RESULT` line of one latency figure (`extra`: further `key=value` fields).
pub fn report(figure: &str, samples: &[Duration], extra: &str) -> Option<Stats> {
    let st = stats(samples);
    match st {
        Some(st) => println!(
            "RESULT rust {figure} median_us={:.0} p90_us={:.0} p99_us={:.0} mean_us={:.0} \
             min_us={:.0} max_us={:.0} n={}{}{extra}",
            st.median,
            st.p90,
            st.p99,
            st.mean,
            st.min,
            st.max,
            st.n,
            if extra.is_empty() { "" } else { " " },
        ),
        None => println!("RESULT rust {figure} n=0 error=no_samples"),
    }
    st
}

/// How many samples are slower than 10 ms and 50 ms (etcd's unsynced-watcher loop runs
/// every 100 ms, so hand-overs that wait for it show up here).
pub fn tail(samples: &[Duration]) -> String {
    let over = |ms| {
        samples
            .iter()
            .filter(|d| **d > Duration::from_millis(ms))
            .count()
    };
    format!("over_10ms={} over_50ms={}", over(10), over(50))
}

/// Figures for the closing human-readable summary, and what later phases and the closing
/// issue #12 block need from earlier ones.
#[derive(Default)]
pub struct Summary {
    pub lines: Vec<String>,
    /// Latency figures by `RESULT` name (`handoff_floor`, `handoff`, `handoff_waiters_2`, ...).
    pub figures: BTreeMap<String, Stats>,
    /// Single numbers by name (`contended_throughput`, `contended_range`, ...).
    pub values: BTreeMap<String, f64>,
    /// Lines for the closing issue #12 block that a phase wrote itself (the held-locks
    /// child process's).
    pub targets: Vec<String>,
}

impl Summary {
    pub fn latency(&mut self, label: &str, st: Option<Stats>) {
        if let Some(st) = st {
            self.lines.push(format!(
                "  {label:<44} median {:>8.0} µs   p90 {:>8.0} µs   p99 {:>8.0} µs   (n={})",
                st.median, st.p90, st.p99, st.n
            ));
        }
    }
    pub fn text(&mut self, line: String) {
        self.lines.push(format!("  {line}"));
    }
    /// Keeps `st` as `figure` for later phases and the closing block.
    pub fn keep(&mut self, figure: &str, st: Option<Stats>) {
        if let Some(st) = st {
            self.figures.insert(figure.to_string(), st);
        }
    }
    pub fn figure(&self, figure: &str) -> Option<Stats> {
        self.figures.get(figure).copied()
    }
    pub fn value(&self, name: &str) -> Option<f64> {
        self.values.get(name).copied()
    }
}
