//! Asking the holders of a name to let go (ZooKeeper's revocable locks, Curator's
//! `Revoker`): one read of the line, then for each holder a put of its request key
//! (`line/request.rs`), bound to the holder's lease and conditional on the holder's key
//! still having the create revision read. The holder is told, and decides: nothing is
//! forced (deleting a holder's key, `etcdctl del`, is the forced release).

use crate::client::Client;
use crate::line::queue;
use crate::line::request;
use crate::recipes::election::Election;
use crate::recipes::holder::Holder;
use crate::recipes::locks::mutex::Mutex;
use crate::recipes::locks::rwlock::RwLock;
use crate::recipes::locks::semaphore::Semaphore;
use crate::recipes::status::{describe, read_line};
use crate::session::Session;
use crate::support::error::code::Code;
use crate::support::error::{Error, Result};
use crate::support::etcd_text;
use crate::support::kv::{Compare, CompareOp, KeyValue, Txn, TxnOp};
use crate::transport::{Retry, Rpc};

/// The longest reason a release request may give, in bytes (1,024).
///
/// ```
/// assert_eq!(etcd_sync::MAX_REASON_LEN, 1024);
/// ```
pub const MAX_REASON_LEN: usize = 1024;

impl Client {
    /// Asks every current holder of lock, read-write lock, semaphore or election `name`
    /// to let go, and returns the holders asked (none if nobody holds). Needs no session.
    ///
    /// A holder of this crate sees the request on its guard's
    /// [`release_requested`](crate::Guard::release_requested) channel, naming who asked
    /// (this process's `"<hostname>:<pid>"`), and decides what to do; nothing is forced.
    /// The request is for the hold read, not for the next holder: it is written only while
    /// that key still has the create revision read, and a later hold of the same session
    /// under the name does not see it.
    ///
    /// The request is the key `<name>.revoke/<rest of the holder's key>`, outside
    /// `<name>/`, so Go's `Mutex` and `etcdctl lock` neither count nor see it. It is bound
    /// to the holder's lease, and a holder of this crate deletes it with its key (or, after
    /// a forced release, once it finds its key gone), so it never outlives the hold it was
    /// for by more than the holder's session. A holder
    /// that is not of this crate (Go, `etcdctl lock`) is asked too but never looks; a key
    /// under the name without a lease (data, not a holder) is not asked.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidArgument`]: `name` is empty, ends with `/` or is longer than 4096 bytes.
    /// * [`Error::Server`]: etcd refused a request, e.g. `PermissionDenied` (with auth on,
    ///   etcd lets a put join a lease only for a user that may write every key bound to
    ///   it: the holder's keys).
    /// * [`Error::Timeout`] / [`Error::Unavailable`]: no endpoint answered.
    /// * [`Error::InsideAsyncRuntime`]: called on an async worker thread.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// for holder in client.request_release("shard-7")? {
    ///     println!("asked {} to let go", holder.key_str());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn request_release(&self, name: impl AsRef<[u8]>) -> Result<Vec<Holder>> {
        let requester = crate::support::identity::default_identity();
        self.ask(name.as_ref(), &requester, None)
    }

    /// [`request_release`](Client::request_release), saying why (at most
    /// [`MAX_REASON_LEN`] bytes): the holder receives it as
    /// [`ReleaseRequest::reason`](crate::ReleaseRequest::reason).
    ///
    /// # Errors
    ///
    /// As [`request_release`](Client::request_release), and [`Error::InvalidArgument`] for
    /// a longer reason.
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
    /// client.request_release_with_reason("shard-7", "rebalancing to host-b")?;
    /// # Ok(()) }
    /// ```
    pub fn request_release_with_reason(
        &self,
        name: impl AsRef<[u8]>,
        reason: &str,
    ) -> Result<Vec<Holder>> {
        if reason.len() > MAX_REASON_LEN {
            return Err(Error::InvalidArgument(format!(
                "release reason is {} bytes; at most {MAX_REASON_LEN} are allowed",
                reason.len()
            )));
        }
        let requester = crate::support::identity::default_identity();
        self.ask(name.as_ref(), &requester, Some(reason))
    }

    /// Asks the holders of `name` on behalf of `requester`.
    fn ask(&self, name: &[u8], requester: &str, reason: Option<&str>) -> Result<Vec<Holder>> {
        let prefix = queue::key_prefix(name)?;
        let rpc = self.rpc().clone();
        self.block_on(async move {
            let (line, holding, _) = read_line(&rpc, &prefix).await?;
            let mut asked = Vec::new();
            for kv in line.into_iter().take(holding) {
                if ask_one(&rpc, name, &kv, requester, reason).await? {
                    asked.push(kv);
                }
            }
            describe(&rpc, &prefix, asked).await
        })
    }
}

/// Writes the request for holder `kv` while its key has the create revision read: whether
/// it was written (not if the holder is gone, or has no lease to bind it to).
async fn ask_one(
    rpc: &Rpc,
    name: &[u8],
    kv: &KeyValue,
    requester: &str,
    reason: Option<&str>,
) -> Result<bool> {
    let Some(key) = request::request_key(name, &kv.key) else {
        return Ok(false);
    };
    if kv.lease == 0 {
        return Ok(false);
    }
    let value = request::encode(kv.create_revision, requester, reason);
    let txn = Txn::new()
        .when([Compare::create_revision(
            kv.key.clone(),
            CompareOp::Equal,
            kv.create_revision,
        )])
        .and_then([TxnOp::put_with_lease(key, value, kv.lease)]);
    // A copy applied late changes nothing: the same value, or the holder's key is gone.
    match rpc.txn(&txn, Retry::Safe).await {
        Ok(response) => Ok(response.succeeded),
        // The holder's lease ended between the read and the put: nobody to ask.
        Err(Error::Server {
            code: Code::NotFound,
            message,
            ..
        }) if message.contains(etcd_text::LEASE_NOT_FOUND) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Asks the holders of `name` as `session`'s identity.
fn on_behalf_of(session: &Session, name: &[u8]) -> Result<Vec<Holder>> {
    session.client().ask(name, session.identity(), None)
}

impl Mutex {
    /// Asks whoever holds this lock to let go ([`Client::request_release`], as this
    /// session's [`identity`](crate::Session::identity)); the holder asked, or `None` if
    /// the lock is free.
    ///
    /// # Errors
    ///
    /// As [`Client::request_release`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let mutex = session.mutex("shard-7")?;
    /// if let Some(holder) = mutex.request_release()? {
    ///     println!("asked {}", holder.value_str());
    /// }
    /// let guard = mutex.lock()?; // waits until the holder lets go
    /// # drop(guard); Ok(()) }
    /// ```
    pub fn request_release(&self) -> Result<Option<Holder>> {
        Ok(on_behalf_of(self.session(), self.name())?
            .into_iter()
            .next())
    }
}

impl RwLock {
    /// Asks every holder of this lock (the writer, or every reader) to let go, as this
    /// session's [`identity`](crate::Session::identity); the holders asked.
    ///
    /// # Errors
    ///
    /// As [`Client::request_release`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let config = session.rwlock("config")?;
    /// println!("asked {} readers", config.request_release()?.len());
    /// # Ok(()) }
    /// ```
    pub fn request_release(&self) -> Result<Vec<Holder>> {
        on_behalf_of(self.session(), self.name())
    }
}

impl Semaphore {
    /// Asks every holder of a permit to let go, as this session's
    /// [`identity`](crate::Session::identity); the holders asked.
    ///
    /// # Errors
    ///
    /// As [`Client::request_release`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let slots = session.semaphore("gpu", 4)?;
    /// println!("asked {} permit holders", slots.request_release()?.len());
    /// # Ok(()) }
    /// ```
    pub fn request_release(&self) -> Result<Vec<Holder>> {
        on_behalf_of(self.session(), self.name())
    }
}

impl Election {
    /// Asks the leader to resign, as this session's
    /// [`identity`](crate::Session::identity); the leader asked, or `None` if nobody
    /// leads. A leader loop's work sees it on
    /// [`Leadership::release_requested`](crate::Guard::release_requested).
    ///
    /// # Errors
    ///
    /// As [`Client::request_release`].
    ///
    /// ```no_run
    /// # fn main() -> etcd_sync::Result<()> {
    /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
    /// let election = session.election("scheduler")?;
    /// if let Some(leader) = election.request_release()? {
    ///     println!("asked {} to step down", leader.value_str());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn request_release(&self) -> Result<Option<Holder>> {
        Ok(on_behalf_of(self.session(), self.name())?
            .into_iter()
            .next())
    }
}
