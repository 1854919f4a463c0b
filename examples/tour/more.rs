//! The tour's second half: the primitives beyond the mutex, introspection, cancelling a
//! wait, barriers, the supervised leader loop, and software transactions. Each step checks
//! what it shows and returns an error if etcd-sync did something else, so the tour is also
//! a smoke test.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use etcd_sync::{CancelToken, Client, Error, TermEnd, TryLockError, WaitOptions};

use crate::step;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A semaphore of 2 admits two sessions and turns the third away; readers share a
/// read-write lock and keep a writer out.
pub fn semaphore_and_rwlock(client: &Client) -> Res<()> {
    step("Semaphore and read-write lock: N holders, or many readers");
    let sessions = [client.session()?, client.session()?, client.session()?];
    let first = sessions[0].semaphore("tour/workers", 2)?.acquire()?;
    let second = sessions[1].semaphore("tour/workers", 2)?.acquire()?;
    match sessions[2].semaphore("tour/workers", 2)?.try_acquire() {
        Err(TryLockError::WouldBlock) => {
            println!("   2 of 2 permits taken; a third session's try_acquire: WouldBlock")
        }
        other => return Err(format!("a third permit out of 2: {other:?}").into()),
    }
    drop(first);
    let third = sessions[2].semaphore("tour/workers", 2)?.acquire()?;
    println!("   one permit returned; the third session acquires it");
    drop((second, third));

    let reader_a = sessions[0].rwlock("tour/config")?.read()?;
    let reader_b = sessions[1].rwlock("tour/config")?.read()?;
    let writer = sessions[2].rwlock("tour/config")?;
    match writer.try_write() {
        Err(TryLockError::WouldBlock) => {
            println!("   two readers hold tour/config together; try_write: WouldBlock")
        }
        other => return Err(format!("a writer beside two readers: {other:?}").into()),
    }
    drop((reader_a, reader_b));
    let guard = writer.write()?;
    println!("   readers gone; the writer holds it alone");
    drop(guard);
    Ok(())
}

/// `Client::status` names who holds and who waits, with no session of its own; a waiter
/// blocked in `lock_with` gives up when its `CancelToken` is cancelled from elsewhere and
/// leaves no key behind.
pub fn status_and_cancel(client: &Client) -> Res<()> {
    step("Who holds, who waits (Client::status), and cancelling a wait from another thread");
    let holder = client.session_builder().identity("tour-holder").start()?;
    let waiter = client.session_builder().identity("tour-waiter").start()?;
    let held = holder.mutex("tour/report")?.lock()?;

    let token = CancelToken::new();
    let (queued_tx, queued_rx) = mpsc::channel();
    let waiting = {
        let token = token.clone();
        thread::spawn(move || {
            let _ = queued_tx.send(());
            let mutex = waiter.mutex("tour/report")?;
            mutex.lock_with(WaitOptions::new().cancel_token(&token))
        })
    };
    let _ = queued_rx.recv();
    // The waiter's key appears once it has joined the line.
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        let status = client.status("tour/report")?;
        if !status.waiters.is_empty() || Instant::now() > deadline {
            break status;
        }
        thread::sleep(Duration::from_millis(20));
    };
    for h in &status.holders {
        let ttl = h
            .ttl
            .map_or("?".to_string(), |t| format!("{} s", t.as_secs()));
        println!(
            "   holder: {} (its lease has {ttl} left)",
            h.identity().unwrap_or_default()
        );
    }
    for w in &status.waiters {
        println!("   waiter: {}", w.identity().unwrap_or_default());
    }
    if status.holders.len() != 1 || status.waiters.len() != 1 {
        return Err(format!("expected 1 holder and 1 waiter, saw {status:?}").into());
    }

    let cancelled_at = Instant::now();
    token.cancel();
    let result = waiting.join().map_err(|_| "waiter panicked")?;
    match result {
        Err(Error::Cancelled) => println!(
            "   cancelled: lock_with returned Cancelled after {:?}",
            cancelled_at.elapsed()
        ),
        other => return Err(format!("the cancelled wait returned {other:?}").into()),
    }
    let left = client.status("tour/report")?;
    if !left.waiters.is_empty() {
        return Err(format!("the cancelled waiter left its key: {left:?}").into());
    }
    println!(
        "   line now: {} holder, {} waiters (the cancelled waiter's key is gone)",
        left.holders.len(),
        left.waiters.len()
    );
    drop(held);
    Ok(())
}

/// A double barrier of 3 lets its participants in together (not before the third comes),
/// and a count-down latch opens its waiter after exactly 3 count-downs.
pub fn barriers(client: &Client) -> Res<()> {
    step("Barriers: enter together, leave together; a count-down latch");
    let started = Instant::now();
    let entered: Vec<_> = (0..3u32)
        .map(|i| {
            let session = client.session()?;
            Ok(thread::spawn(move || -> Result<_, Error> {
                thread::sleep(Duration::from_millis(200) * i);
                let barrier = session.double_barrier("tour/rendezvous", 3)?;
                barrier.enter_timeout(Duration::from_secs(10))?;
                let at = started.elapsed();
                barrier.leave_timeout(Duration::from_secs(10))?;
                Ok(at)
            }))
        })
        .collect::<Res<_>>()?;
    let mut times = Vec::new();
    for participant in entered {
        times.push(participant.join().map_err(|_| "a participant panicked")??);
    }
    let first = times.iter().min().copied().unwrap_or_default();
    if first < Duration::from_millis(400) {
        return Err(format!("a participant entered at {first:?}, before the third came").into());
    }
    println!(
        "   3 participants arrived 200 ms apart; all entered at {first:?} or later, then left"
    );

    let latch = client.count_down_latch("tour/loaded")?;
    latch.try_set_count(3)?;
    let (opened_tx, opened_rx) = mpsc::channel();
    let waiter = client.count_down_latch("tour/loaded")?;
    thread::spawn(move || {
        let _ = opened_tx.send(waiter.wait_timeout(Duration::from_secs(10)));
    });
    for _ in 0..2 {
        latch.count_down()?;
    }
    if opened_rx.recv_timeout(Duration::from_millis(300)).is_ok() {
        return Err("the latch opened after 2 of 3 count-downs".into());
    }
    latch.count_down()?;
    opened_rx.recv_timeout(Duration::from_secs(5))??;
    println!(
        "   the latch's waiter stayed blocked at 1 left and went on after the third count-down"
    );
    Ok(())
}

/// Two processes' worth of leader loops: deleting the leader's key (as an operator with
/// etcdctl would) ends its term at once, the other loop is elected, and cancelling both
/// ends them.
pub fn leader_loop(client: &Client) -> Res<()> {
    step("Leader loop: lead until cancelled, step down on loss, campaign again");
    let cancel = CancelToken::new();
    let (events_tx, events_rx) = mpsc::channel::<String>();
    let loops: Vec<_> = ["node-a", "node-b"]
        .into_iter()
        .map(|name| {
            let client = client.clone();
            let cancel = cancel.clone();
            let events = events_tx.clone();
            thread::spawn(move || -> etcd_sync::Result<()> {
                let session = client.session()?;
                let election = session.election("tour/scheduler")?;
                let on_elected = events.clone();
                let on_lost = events.clone();
                election
                    .leader_loop(name)
                    .on_elected(move |l| {
                        let _ = on_elected.send(format!(
                            "{name} elected (fencing token {})",
                            l.fencing_token()
                        ));
                    })
                    .on_lost(move |end| {
                        let why = match end {
                            TermEnd::Lost(e) => format!("lost: {e}"),
                            TermEnd::Cancelled => "cancelled".to_string(),
                            other => format!("{other:?}"),
                        };
                        let _ = on_lost.send(format!("{name} term ended ({why})"));
                    })
                    .run(&cancel, |leadership, cancel| {
                        // The leader's work: here, wait until told to stop.
                        etcd_sync::crossbeam_channel::select! {
                            recv(leadership.lost()) -> _ => {}
                            recv(cancel.cancelled()) -> _ => {}
                        }
                    })
            })
        })
        .collect();
    drop(events_tx);
    let next = |what: &str| -> Res<(String, Instant)> {
        let event = events_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| format!("no {what} within 10 s"))?;
        println!("   {event}");
        Ok((event, Instant::now()))
    };

    let (first, _) = next("first election")?;
    let leader = client
        .status("tour/scheduler")?
        .holders
        .into_iter()
        .next()
        .ok_or("an elected loop but no holder")?;
    let deleted_at = Instant::now();
    client.delete(leader.key.clone())?;
    println!(
        "   deleted the leader's key {} from outside",
        leader.key_str()
    );
    // The loser's term end and the winner's election come from two threads, in either order.
    let events = [next("term end")?, next("second election")?];
    let first_name = first.split(' ').next().unwrap_or_default();
    let lost = events
        .iter()
        .any(|(e, _)| e.starts_with(&format!("{first_name} term ended")));
    let won = events
        .iter()
        .find(|(e, _)| e.contains(" elected") && !e.starts_with(first_name));
    match (lost, won) {
        (true, Some((_, at))) => println!(
            "   the other loop was elected {:?} after the delete",
            at.duration_since(deleted_at)
        ),
        _ => {
            return Err(
                format!("expected {first_name} to lose and the other to win: {events:?}").into(),
            );
        }
    }

    cancel.cancel();
    for handle in loops {
        handle.join().map_err(|_| "leader loop panicked")??;
    }
    while let Ok(event) = events_rx.try_recv() {
        println!("   {event}");
    }
    println!("   both loops returned after cancel");
    Ok(())
}

/// Software transactions: 4 threads add 5 each to a counter with no lock; conflicting
/// commits run again, so none is lost.
pub fn stm(client: &Client) -> Res<()> {
    step("STM: 4 threads add 5 each to a counter in transactions, no lock (Go's NewSTM)");
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let client = client.clone();
            thread::spawn(move || -> etcd_sync::Result<u32> {
                let mut attempts = 0;
                for _ in 0..5 {
                    client.stm(|tx| {
                        attempts += 1;
                        let n: u64 = tx
                            .get("tour/stm-counter")?
                            .and_then(|v| String::from_utf8(v).ok()?.parse().ok())
                            .unwrap_or(0);
                        tx.put("tour/stm-counter", (n + 1).to_string());
                        Ok(())
                    })?;
                }
                Ok(attempts)
            })
        })
        .collect();
    let mut attempts = 0;
    for worker in workers {
        attempts += worker.join().map_err(|_| "STM worker panicked")??;
    }
    let counter = client
        .get("tour/stm-counter")?
        .map(|kv| kv.value_str().into_owned());
    if counter.as_deref() != Some("20") {
        return Err(format!("STM counter is {counter:?}, not 20").into());
    }
    println!(
        "   counter = 20 after 20 transactions in {attempts} attempts (each conflict ran again)"
    );
    Ok(())
}
