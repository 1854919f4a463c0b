//! A raw watch on one key, with no lock logic around it: the physical limit of a lock
//! handoff is the release Txn plus the time from a delete to a watcher's event, and benches
//! measure that second part with [`RawWatch`].

use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::client::Client;
use crate::support::error::{Error, Result};
use crate::transport::watch::{EventKind, Only, Watch, WatchStream};

/// A watcher on one key that reports its deletes, read from a blocking thread.
///
/// The watcher is created "from now" (etcd serves it as synced, like a lock waiter's) on
/// a watch stream of its own, over the client's connection to its current endpoint.
/// [`RawWatch::deletes`] returns once etcd confirmed the watcher. A task on the client's
/// runtime then reads the stream and forwards each delete into a channel that
/// [`next_delete`](RawWatch::next_delete) reads, which is how a blocked thread is woken by a
/// watch event. Puts are filtered out by etcd. Dropping the `RawWatch` stops the task
/// and closes the stream.
///
/// There is no reconnection or failover: if the stream fails, `next_delete` returns the
/// error once and [`Error::Unavailable`] after that. If etcd cancels the watcher, no more
/// deletes arrive, and `next_delete` returns `Ok(None)` when its timeout runs out.
///
/// # Example
///
/// ```no_run
/// use std::time::{Duration, Instant};
/// use etcd_sync::testing::RawWatch;
///
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// client.put("k", "v")?;
/// let watch = RawWatch::deletes(&client, "k")?;
/// let t0 = Instant::now();
/// client.delete("k")?;
/// let revision = watch.next_delete(Duration::from_secs(5))?;
/// assert!(revision.is_some());
/// println!("delete to event: {:?}", t0.elapsed());
/// # Ok(()) }
/// ```
pub struct RawWatch {
    key: Vec<u8>,
    deletes: Receiver<Result<i64>>,
    // Dropped before `_client`: ends the forwarding task, which drops the stream.
    _stop: tokio::sync::oneshot::Sender<()>,
    _client: Client,
}

impl RawWatch {
    /// Watches `key` for deletes from now on; returns once etcd has created the watcher,
    /// so a delete after this call is reported.
    ///
    /// Errors: an empty key, a failure to open the stream, or
    /// [`Error::InsideAsyncRuntime`] on a thread that drives async tasks.
    pub fn deletes(client: &Client, key: impl AsRef<[u8]>) -> Result<RawWatch> {
        let key = key.as_ref().to_vec();
        if key.is_empty() {
            return Err(Error::InvalidArgument("empty key".into()));
        }
        let rpc = client.rpc().clone();
        let create = vec![Watch::key(&key, 0, Only::Deletes)];
        let (stream, _created) =
            client.block_on(async move { WatchStream::open(&rpc, create).await })?;
        let (tx, deletes) = crossbeam_channel::unbounded();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        client.spawn(async move {
            tokio::select! {
                _ = stopped => {}
                _ = forward(stream, tx) => {}
            }
        });
        Ok(RawWatch {
            key,
            deletes,
            _stop: stop,
            _client: client.clone(),
        })
    }

    /// Blocks until the next delete of the key and returns its revision (the delete's
    /// `mod_revision`), or `Ok(None)` if none arrived within `timeout`.
    ///
    /// Deletes that happened while nobody was waiting are kept, in order.
    pub fn next_delete(&self, timeout: Duration) -> Result<Option<i64>> {
        match self.deletes.recv_timeout(timeout) {
            Ok(delete) => delete.map(Some),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                Err(Error::unavailable("the raw watch stream has ended"))
            }
        }
    }

    /// The watched key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }
}

impl std::fmt::Debug for RawWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawWatch")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("pending", &self.deletes.len())
            .finish_non_exhaustive()
    }
}

/// Reads the stream and sends each delete's revision, until the stream fails or the
/// `RawWatch` is gone.
async fn forward(mut stream: WatchStream, deletes: Sender<Result<i64>>) {
    loop {
        let response = match stream.next().await {
            Ok(response) => response,
            Err(e) => {
                let _ = deletes.send(Err(e));
                return;
            }
        };
        for event in response.events {
            if event.kind == EventKind::Delete && deletes.send(Ok(event.kv.mod_revision)).is_err() {
                return;
            }
        }
    }
}
