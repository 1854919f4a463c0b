//! The tour's step on downgrading a write lock: a writer queued behind a downgradable
//! write does not get in between the write and the read it becomes, and a reader queued
//! before that writer shares the read at once.

use std::time::Duration;

use etcd_sync::{Client, DowngradeError, TryLockError};

use crate::step;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Writes, downgrades with a writer and a reader waiting behind, and shows who holds.
pub fn downgrade(client: &Client) -> Res<()> {
    step("From write to read with no gap: RwLock::write_downgradable, then downgrade");
    let mine = client.session()?;
    let writer = client.session()?;
    let reader = client.session()?;
    let write = mine.rwlock("tour/catalog")?.write_downgradable()?;
    let token = write.fencing_token();
    // A reader, then a writer, queue behind the write.
    let queued_reader = {
        let lock = reader.rwlock("tour/catalog")?;
        std::thread::spawn(move || lock.read_timeout(Duration::from_secs(10)))
    };
    std::thread::sleep(Duration::from_millis(200));
    let queued_writer = {
        let lock = writer.rwlock("tour/catalog")?;
        std::thread::spawn(move || lock.write_timeout(Duration::from_secs(10)))
    };
    std::thread::sleep(Duration::from_millis(200));
    if queued_reader.is_finished() {
        return Err("a reader got in beside our write".into());
    }
    println!("   we write; a reader and then a writer queue behind us");
    let read = write.downgrade().map_err(DowngradeError::into_error)?;
    println!(
        "   downgraded: we read now (fencing token {} as when we wrote: {token})",
        read.fencing_token()
    );
    let theirs = queued_reader
        .join()
        .map_err(|_| "the queued reader's thread panicked")??;
    println!("   the queued reader shares the read at once");
    if queued_writer.is_finished() {
        return Err("the queued writer got in between our write and our read".into());
    }
    match writer.rwlock("tour/catalog")?.try_write() {
        Err(TryLockError::WouldBlock) => {}
        other => return Err(format!("a writer beside two readers: {other:?}").into()),
    }
    let holders = client.status("tour/catalog")?.holders.len();
    println!("   status: {holders} readers hold, the writer still waits");
    if holders != 2 {
        return Err(format!("expected 2 readers, status shows {holders}").into());
    }
    drop((read, theirs));
    let taken = queued_writer
        .join()
        .map_err(|_| "the queued writer's thread panicked")??;
    println!(
        "   both reads released: the queued writer holds (fencing token {})",
        taken.fencing_token()
    );
    Ok(())
}
