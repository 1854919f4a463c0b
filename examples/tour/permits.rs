//! The tour's step on taking several permits at once: a request of 3 of 4 permits leaves
//! room for one, a request of 2 waits, and `status` shows each holder's weight.

use etcd_sync::{Client, TryLockError};

use crate::step;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// 3 of 4 permits for one session, then one more for a second; a third session's request
/// of 2 is turned away until the 3 come back.
pub fn several_permits(client: &Client) -> Res<()> {
    step("Several permits at once: Semaphore::acquire_many");
    let sessions = [client.session()?, client.session()?, client.session()?];
    let big = sessions[0].semaphore("tour/gpus", 4)?.acquire_many(3)?;
    let one = sessions[1].semaphore("tour/gpus", 4)?.acquire()?;
    let weights: Vec<_> = client
        .status("tour/gpus")?
        .holders
        .iter()
        .map(|h| h.num_permits())
        .collect();
    println!("   one session holds 3 of 4 permits, another 1; status weighs them: {weights:?}");
    if weights != [Some(3), Some(1)] || big.num_permits() != 3 {
        return Err(format!("unexpected weights {weights:?}").into());
    }
    let two = sessions[2].semaphore("tour/gpus", 4)?;
    match two.try_acquire_many(2) {
        Err(TryLockError::WouldBlock) => println!("   a request of 2 more: WouldBlock"),
        other => return Err(format!("2 more permits out of 0 free: {other:?}").into()),
    }
    drop(big);
    let taken = two.try_acquire_many(2)?;
    println!(
        "   the 3 came back; the request of 2 holds ({} permits)",
        taken.num_permits()
    );
    drop((one, taken));
    Ok(())
}
