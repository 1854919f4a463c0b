#![cfg(feature = "testing")]
mod common;
use common::{client, etcd, events_delivered, session};
use std::time::Duration;
#[test]
fn scratch() {
    let server = etcd();
    let endpoints = server.endpoints();
    let n: usize = std::env::var("N").unwrap().parse().unwrap();
    let rounds: usize = std::env::var("R").unwrap().parse().unwrap();
    let start = std::sync::Arc::new(std::sync::Barrier::new(n + 1));
    let mut threads = Vec::new();
    for _ in 0..n {
        let own = client(&endpoints);
        let s = session(&own, 30);
        let m = s.mutex("again").unwrap();
        let start = start.clone();
        threads.push(std::thread::spawn(move || {
            start.wait();
            for _ in 0..rounds {
                let g = m.lock().unwrap();
                drop(g);
            }
            drop((s, own));
        }));
    }
    let metric = |name: &str| {
        etcd_sync::testing::metrics::parse(&server.metrics().unwrap())
            .unwrap()
            .sum(name, &[])
    };
    let before = events_delivered(&server.metrics().unwrap());
    start.wait();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(500));
        eprintln!(
            "watchers={} slow={} events={}",
            metric("etcd_debugging_mvcc_watcher_total"),
            metric("etcd_debugging_mvcc_slow_watcher_total"),
            events_delivered(&server.metrics().unwrap()) - before
        );
    }
    for t in threads {
        t.join().unwrap();
    }
    let per = (events_delivered(&server.metrics().unwrap()) - before) as f64 / (n * rounds) as f64;
    eprintln!("{n} x {rounds}: {per:.1} events per acquisition");
}
