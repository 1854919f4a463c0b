//! Who holds a name and who waits for it, as reported by [`Client::status`] and the
//! recipes' `status()`, and who leads an election ([`Client::leader`], the
//! [`LeaderEvent`](crate::LeaderEvent)s of an observer): plain data, read in `status.rs`
//! and `election/observe.rs`.

use std::borrow::Cow;
use std::time::Duration;

// `Client` names the method in the docs' links.
#[cfg(doc)]
use crate::client::Client;
use crate::line::mode::Mode;
use crate::support::kv::{KeyValue, text};

/// How a key shares its name's line, read from the key's name.
///
/// ```
/// use etcd_sync::KeyMode;
/// fn describe(mode: KeyMode) -> String {
///     match mode {
///         KeyMode::Exclusive => "exclusive".into(),
///         KeyMode::Shared => "shared".into(),
///         KeyMode::Permits(n) => format!("one of {n} permits"),
///         KeyMode::Other => "not a lock key".into(),
///     }
/// }
/// assert_eq!(describe(KeyMode::Permits(3)), "one of 3 permits");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyMode {
    /// `<name>/<lease hex>`: a [`Mutex`](crate::Mutex), an [`RwLock`](crate::RwLock)
    /// writer, an [`Election`](crate::Election) candidate, `etcdctl lock` or `etcdctl
    /// elect`, Go's `concurrency` package.
    Exclusive,
    /// `<name>/<lease hex>.shared`: an [`RwLock`](crate::RwLock) reader.
    Shared,
    /// `<name>/<lease hex>.permits-<N>`: a permit of a [`Semaphore`](crate::Semaphore) of N;
    /// `<name>/<lease hex>.permits-<N>.x<k>`: k of its permits at once
    /// ([`Holder::num_permits`]).
    Permits(u32),
    /// Any other key under `<name>/` (data, a nested lock name): every participant waits
    /// for it as for an exclusive holder.
    Other,
}

impl KeyMode {
    /// The mode of `key` under `prefix` (`<name>/`).
    pub(crate) fn of_key(prefix: &[u8], key: &[u8]) -> KeyMode {
        match Mode::of_key(prefix, key) {
            Some(Mode::Exclusive) => KeyMode::Exclusive,
            Some(Mode::Shared) => KeyMode::Shared,
            Some(Mode::Permits(n, _)) => KeyMode::Permits(n),
            None => KeyMode::Other,
        }
    }
}

/// One key in a name's line: a holder, or a waiter (a candidate, for an election); an
/// election's leader is its oldest holder.
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// for holder in client.status("jobs/nightly")?.holders {
///     println!(
///         "{} held by {} (lease {:x}, token {}, {:?} left)",
///         holder.key_str(),
///         holder.identity().unwrap_or("(none: etcdctl or Go)".into()),
///         holder.lease,
///         holder.create_revision,
///         holder.ttl,
///     );
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The key, `<name>/<lease hex>[suffix]` (see [`mode`](Holder::mode)).
    pub key: Vec<u8>,
    /// The key's value: for a lock key (a `Mutex`, `RwLock`, `Semaphore` of this crate)
    /// the identity of the session that took it ([`Session::identity`](crate::Session::identity));
    /// for an election candidate the value it campaigned with or proclaimed; empty for
    /// `etcdctl lock` and Go's `Mutex`, which store no value.
    pub value: Vec<u8>,
    /// The lease the key is bound to (its session's), or 0 for a key without one.
    pub lease: i64,
    /// The key's create revision: its fencing token, and its place in the line.
    pub create_revision: i64,
    /// The revision of the key's last write: for an election's leader, of its last
    /// proclamation.
    pub mod_revision: i64,
    /// How the key shares the name.
    pub mode: KeyMode,
    /// What etcd said was left of the lease's TTL just after the line was read, in whole
    /// seconds (rounded down). `None` if the key has no lease or the lease is gone (the key
    /// goes with it), and in a [`LeaderEvent`](crate::LeaderEvent): an observer reports
    /// from the watch's events and looks no lease up.
    pub ttl: Option<Duration>,
}

impl Holder {
    /// `kv`, a key under `prefix` (`<name>/`), with the TTL left of its lease.
    pub(crate) fn of(prefix: &[u8], kv: KeyValue, ttl: Option<Duration>) -> Holder {
        Holder {
            mode: KeyMode::of_key(prefix, &kv.key),
            ttl,
            key: kv.key,
            value: kv.value,
            lease: kv.lease,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
        }
    }

    /// The key as text (invalid UTF-8 replaced).
    ///
    /// ```
    /// # use etcd_sync::{Holder, KeyMode};
    /// let h = Holder { key: b"jobs/694d".to_vec(), value: vec![], lease: 0x694d, create_revision: 7, mod_revision: 7, mode: KeyMode::Exclusive, ttl: None };
    /// assert_eq!(h.key_str(), "jobs/694d");
    /// ```
    pub fn key_str(&self) -> Cow<'_, str> {
        text(&self.key)
    }

    /// How many permits of a [`Semaphore`](crate::Semaphore) this key takes (holds, or
    /// waits for): `k` for a key of [`acquire_many(k)`](crate::Semaphore::acquire_many),
    /// 1 for any other permit; `None` for a key that is not a permit.
    ///
    /// ```
    /// # use etcd_sync::{Holder, KeyMode};
    /// let h = Holder { key: b"gpus/694d.permits-8.x3".to_vec(), value: vec![], lease: 0x694d, create_revision: 7, mod_revision: 7, mode: KeyMode::Permits(8), ttl: None };
    /// assert_eq!(h.num_permits(), Some(3));
    /// let one = Holder { key: b"gpus/694e.permits-8".to_vec(), ..h.clone() };
    /// assert_eq!(one.num_permits(), Some(1));
    /// let lock = Holder { key: b"gpus/694f".to_vec(), mode: KeyMode::Exclusive, ..h };
    /// assert_eq!(lock.num_permits(), None);
    /// ```
    pub fn num_permits(&self) -> Option<u32> {
        match self.mode {
            KeyMode::Permits(_) => Mode::weight_of_permit_key(&self.key),
            KeyMode::Exclusive | KeyMode::Shared | KeyMode::Other => None,
        }
    }

    /// The value as text (invalid UTF-8 replaced).
    ///
    /// ```
    /// # use etcd_sync::{Holder, KeyMode};
    /// let h = Holder { key: vec![], value: b"host-a:8080".to_vec(), lease: 1, create_revision: 7, mod_revision: 7, mode: KeyMode::Exclusive, ttl: None };
    /// assert_eq!(h.value_str(), "host-a:8080");
    /// ```
    pub fn value_str(&self) -> Cow<'_, str> {
        text(&self.value)
    }

    /// The value as text, or `None` when it is empty: the key was taken by `etcdctl lock`
    /// or Go's `Mutex`, which store no identity.
    ///
    /// ```
    /// # use etcd_sync::{Holder, KeyMode};
    /// let ours = Holder { key: vec![], value: b"host-a:4242".to_vec(), lease: 1, create_revision: 7, mod_revision: 7, mode: KeyMode::Exclusive, ttl: None };
    /// assert_eq!(ours.identity().as_deref(), Some("host-a:4242"));
    /// let etcdctl = Holder { value: vec![], ..ours };
    /// assert_eq!(etcdctl.identity(), None);
    /// ```
    pub fn identity(&self) -> Option<Cow<'_, str>> {
        (!self.value.is_empty()).then(|| self.value_str())
    }
}

/// A name's line at one revision: who holds it and who waits, by the rules the waiters
/// themselves apply (the oldest key holds; readers in a row share; the first permits of a
/// semaphore of N whose weights fit in N hold). From [`Client::status`], and from the `status()` of
/// [`Mutex`](crate::Mutex), [`RwLock`](crate::RwLock), [`Semaphore`](crate::Semaphore)
/// and [`Election`](crate::Election).
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let status = client.status("jobs/nightly")?;
/// if !status.is_held() {
///     println!("nobody holds {}", status.name_str());
/// }
/// println!("{} waiting", status.waiters.len());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The name (the keys are under `<name>/`).
    pub name: Vec<u8>,
    /// The keys that hold the name now, oldest first: one exclusive key, or readers, or
    /// permits that take at most N in all ([`Holder::num_permits`]). Empty when nobody
    /// holds it.
    pub holders: Vec<Holder>,
    /// The other keys, in line order (create revision): who gets the name next comes
    /// first.
    pub waiters: Vec<Holder>,
    /// The store revision of the read that saw this line.
    pub revision: i64,
}

impl Status {
    /// Whether anyone holds the name.
    ///
    /// ```
    /// let status = etcd_sync::Status { name: b"jobs".to_vec(), holders: vec![], waiters: vec![], revision: 1 };
    /// assert!(!status.is_held());
    /// ```
    pub fn is_held(&self) -> bool {
        !self.holders.is_empty()
    }

    /// The oldest holder: the one holder of a lock, a write lock or an election (its
    /// leader), the oldest of the readers or permits that share the name; `None` when
    /// nobody holds it.
    ///
    /// ```
    /// use etcd_sync::{Holder, KeyMode, Status};
    /// let leader = Holder { key: b"e/694d".to_vec(), value: b"host-a".to_vec(), lease: 0x694d, create_revision: 7, mod_revision: 7, mode: KeyMode::Exclusive, ttl: None };
    /// let status = Status { name: b"e".to_vec(), holders: vec![leader], waiters: vec![], revision: 9 };
    /// assert_eq!(status.holder().map(|h| h.value_str()).as_deref(), Some("host-a"));
    /// ```
    pub fn holder(&self) -> Option<&Holder> {
        self.holders.first()
    }

    /// The name as text (invalid UTF-8 replaced).
    ///
    /// ```
    /// let status = etcd_sync::Status { name: b"jobs".to_vec(), holders: vec![], waiters: vec![], revision: 1 };
    /// assert_eq!(status.name_str(), "jobs");
    /// ```
    pub fn name_str(&self) -> Cow<'_, str> {
        text(&self.name)
    }
}
