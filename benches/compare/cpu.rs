//! Client CPU per operation (issue 49): the user + system time of this whole process
//! (its private runtime's threads included) from `getrusage`, over a pass of one
//! operation alone, divided by the operations. On 2 cores a client's CPU is taken from
//! etcd's, so it is latency; and unlike latency, it hardly moves with the machine's load.
//! The Go and etcd-client drivers print the same figure the same way.

use std::time::Duration;

use crate::Res;

/// User + system CPU time this process has used so far.
pub fn process_cpu() -> Duration {
    // SAFETY: `getrusage` writes into the zeroed struct we own and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Runs `op` `n` times and prints `RESULT rust cpu_<figure> us_per_op=… n=…`; returns
/// the µs per operation.
pub fn per_op(figure: &str, n: usize, mut op: impl FnMut() -> Res<()>) -> Res<f64> {
    let before = process_cpu();
    for _ in 0..n {
        op()?;
    }
    let used = process_cpu().saturating_sub(before);
    let us = used.as_secs_f64() * 1e6 / n.max(1) as f64;
    println!("RESULT rust cpu_{figure} us_per_op={us:.1} n={n}");
    Ok(us)
}
