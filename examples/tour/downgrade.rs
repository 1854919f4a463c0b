//! The tour's step on downgrading a write lock: a writer queued behind a downgradable
//! write does not get in between the write and the read it becomes, and readers behind
//! it share the read at once.

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
    // A writer and a reader queue behind the write.
    let queued_writer = {
        let lock = writer.rwlock("tour/catalog")?;
        std::thread::spawn(move || lock.write_timeout(Duration::from_secs(10)))
    };
    std::thread::sleep(Duration::from_millis(200));
    let read_lock = reader.rwlock("tour/catalog")?;
    match read_lock.try_read() {
        Err(TryLockError::WouldBlock) => println!("   while we write, a reader: WouldBlock"),
        other => return Err(format!("a reader beside our write: {other:?}").into()),
    }
    let read = write.downgrade().map_err(DowngradeError::into_error)?;
    println!(
        "   downgraded: we read now (fencing token {} as when we wrote: {token})",
        read.fencing_token()
    );
    let theirs = read_lock.try_read()?;
    println!("   another reader shares it at once, though a writer queued before it");
    if queued_writer.is_finished() {
        return Err("the queued writer got in between our write and our read".into());
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
