//! A recorder that keeps everything it is given, for assertions: counters as totals, gauges
//! as their last value, histograms as every sample. Installed globally, because the crate
//! emits from its own threads (keep-alive, runtime worker), which a thread-local recorder
//! would not see.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

/// A metric's name and its labels, sorted.
type Id = (String, Vec<(String, String)>);

#[derive(Default)]
struct Store {
    counters: BTreeMap<Id, u64>,
    gauges: BTreeMap<Id, f64>,
    histograms: BTreeMap<Id, Vec<f64>>,
}

/// What has been recorded so far.
#[derive(Clone, Default)]
pub struct Recorded(Arc<Mutex<Store>>);

/// The process's recorder, installed on first use.
pub fn recorded() -> &'static Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let recorded = Recorded::default();
        metrics::set_global_recorder(recorded.clone()).expect("no other recorder");
        recorded
    })
}

fn id(key: &Key) -> Id {
    let mut labels: Vec<(String, String)> = key
        .labels()
        .map(|l| (l.key().to_owned(), l.value().to_owned()))
        .collect();
    labels.sort();
    (key.name().to_owned(), labels)
}

/// Whether `labels` contains every pair of `wanted`.
fn matches(labels: &[(String, String)], wanted: &[(&str, &str)]) -> bool {
    wanted
        .iter()
        .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
}

impl Recorded {
    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sum of the counters named `name` whose labels include `labels`.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let store = self.store();
        store
            .counters
            .iter()
            .filter(|((n, l), _)| n == name && matches(l, labels))
            .map(|(_, v)| *v)
            .sum()
    }

    /// The gauge named `name` (no labels), if set.
    pub fn gauge(&self, name: &str) -> Option<f64> {
        let store = self.store();
        store.gauges.get(&(name.to_owned(), Vec::new())).copied()
    }

    /// Every sample of the histograms named `name` whose labels include `labels`.
    pub fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        let store = self.store();
        store
            .histograms
            .iter()
            .filter(|((n, l), _)| n == name && matches(l, labels))
            .flat_map(|(_, v)| v.iter().copied())
            .collect()
    }
}

/// One registered metric: its id and the shared store.
struct Handle(Id, Recorded);

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        *self.1.store().counters.entry(self.0.clone()).or_default() += value;
    }
    fn absolute(&self, value: u64) {
        self.1.store().counters.insert(self.0.clone(), value);
    }
}

impl GaugeFn for Handle {
    fn increment(&self, value: f64) {
        *self.1.store().gauges.entry(self.0.clone()).or_default() += value;
    }
    fn decrement(&self, value: f64) {
        *self.1.store().gauges.entry(self.0.clone()).or_default() -= value;
    }
    fn set(&self, value: f64) {
        self.1.store().gauges.insert(self.0.clone(), value);
    }
}

impl HistogramFn for Handle {
    fn record(&self, value: f64) {
        let mut store = self.1.store();
        store
            .histograms
            .entry(self.0.clone())
            .or_default()
            .push(value);
    }
}

impl Recorder for Recorded {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Handle(id(key), self.clone())))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(Arc::new(Handle(id(key), self.clone())))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Handle(id(key), self.clone())))
    }
}
