//! Plain key-value types: what `get` returns and how a transaction is spelled.
//!
//! These mirror etcd's own messages (`KeyValue`, `Compare`, `RequestOp`) with Rust names, so
//! the generated protobuf types never appear in the public API.

/// A key and its value with etcd's revision bookkeeping.
///
/// # Example
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// client.put("config/mode", "fast")?;
/// if let Some(kv) = client.get("config/mode")? {
///     println!("{} = {} (created at revision {})", kv.key_str(), kv.value_str(), kv.create_revision);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The revision of the write that created the key (the lock's fencing token).
    pub create_revision: i64,
    /// The revision of the last write to the key.
    pub mod_revision: i64,
    /// How many times the key was written since it was created (1 after the first put).
    pub version: i64,
    /// The lease the key is bound to, or 0.
    pub lease: i64,
}

impl KeyValue {
    /// The key as UTF-8, with invalid bytes replaced.
    ///
    /// ```
    /// let kv = etcd_sync::KeyValue { key: b"a/b".to_vec(), ..Default::default() };
    /// assert_eq!(kv.key_str(), "a/b");
    /// ```
    pub fn key_str(&self) -> std::borrow::Cow<'_, str> {
        text(&self.key)
    }

    /// The value as UTF-8, with invalid bytes replaced.
    ///
    /// ```
    /// let kv = etcd_sync::KeyValue { value: b"v".to_vec(), ..Default::default() };
    /// assert_eq!(kv.value_str(), "v");
    /// ```
    pub fn value_str(&self) -> std::borrow::Cow<'_, str> {
        text(&self.value)
    }
}

/// How a [`Compare`] relates the stored value to the given one.
///
/// ```
/// use etcd_sync::{Compare, CompareOp};
/// let cmp = Compare::version("k", CompareOp::Greater, 0); // "k exists"
/// # let _ = cmp;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    /// Stored == given.
    Equal,
    /// Stored != given.
    NotEqual,
    /// Stored > given.
    Greater,
    /// Stored < given.
    Less,
}

/// One condition of a transaction. A missing key compares as zero (revisions, version,
/// lease), so `create_revision(k, Equal, 0)` means "k does not exist".
///
/// # Example
///
/// ```
/// use etcd_sync::{Compare, CompareOp};
/// // compare-and-swap: only if "counter" still has the mod revision we read
/// let cas = Compare::mod_revision("counter", CompareOp::Equal, 42);
/// # let _ = cas;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Compare {
    pub(crate) key: Vec<u8>,
    pub(crate) op: CompareOp,
    pub(crate) target: CompareTarget,
}

/// What a [`Compare`] looks at, with the value to compare it to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CompareTarget {
    Version(i64),
    Create(i64),
    Mod(i64),
    Value(Vec<u8>),
    Lease(i64),
}

impl Compare {
    fn new(key: impl Into<Vec<u8>>, op: CompareOp, target: CompareTarget) -> Compare {
        Compare {
            key: key.into(),
            op,
            target,
        }
    }

    /// Compares the key's create revision (0 when absent).
    ///
    /// ```
    /// let absent = etcd_sync::Compare::create_revision("k", etcd_sync::CompareOp::Equal, 0);
    /// # let _ = absent;
    /// ```
    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Compare {
        Compare::new(key, op, CompareTarget::Create(revision))
    }

    /// Compares the key's last modification revision (0 when absent).
    ///
    /// ```
    /// let unchanged = etcd_sync::Compare::mod_revision("k", etcd_sync::CompareOp::Equal, 7);
    /// # let _ = unchanged;
    /// ```
    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Compare {
        Compare::new(key, op, CompareTarget::Mod(revision))
    }

    /// Compares the key's version (number of writes since creation; 0 when absent).
    ///
    /// ```
    /// let exists = etcd_sync::Compare::version("k", etcd_sync::CompareOp::Greater, 0);
    /// # let _ = exists;
    /// ```
    pub fn version(key: impl Into<Vec<u8>>, op: CompareOp, version: i64) -> Compare {
        Compare::new(key, op, CompareTarget::Version(version))
    }

    /// Compares the key's value byte-wise. A missing key fails every value comparison.
    ///
    /// ```
    /// let is_on = etcd_sync::Compare::value("mode", etcd_sync::CompareOp::Equal, "on");
    /// # let _ = is_on;
    /// ```
    pub fn value(key: impl Into<Vec<u8>>, op: CompareOp, value: impl Into<Vec<u8>>) -> Compare {
        Compare::new(key, op, CompareTarget::Value(value.into()))
    }

    /// Compares the lease the key is bound to (0 when absent or unbound).
    ///
    /// ```
    /// let mine = etcd_sync::Compare::lease("k", etcd_sync::CompareOp::Equal, 0x1234);
    /// # let _ = mine;
    /// ```
    pub fn lease(key: impl Into<Vec<u8>>, op: CompareOp, lease: i64) -> Compare {
        Compare::new(key, op, CompareTarget::Lease(lease))
    }
}

/// One operation inside a transaction branch.
///
/// ```
/// use etcd_sync::TxnOp;
/// let ops = [TxnOp::put("a", "1"), TxnOp::get("b"), TxnOp::delete("c")];
/// # let _ = ops;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct TxnOp(pub(crate) Op);

/// The operations a transaction branch can hold.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Op {
    Range(Range),
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        lease: i64,
    },
    Delete {
        key: Vec<u8>,
    },
    Txn(Txn),
}

/// A read of one key or a key range, with the options the waiting line needs.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Range {
    pub(crate) key: Vec<u8>,
    /// Empty: only `key`.
    pub(crate) range_end: Vec<u8>,
    /// 0: no limit.
    pub(crate) limit: i64,
    /// Order by create revision: `Some(true)` oldest first, `Some(false)` newest first.
    pub(crate) by_create_revision: Option<bool>,
    /// 0: no bound.
    pub(crate) max_create_revision: i64,
    pub(crate) keys_only: bool,
    /// Read the store as of this revision; 0: the newest.
    pub(crate) revision: i64,
    /// Answered by the member asked, from its own store, without a round of consensus
    /// (etcd's `serializable`): cheaper, and possibly behind the cluster.
    pub(crate) serializable: bool,
}

impl Range {
    /// Every key starting with `prefix`.
    pub(crate) fn prefix(prefix: &[u8]) -> Range {
        Range {
            key: prefix.to_vec(),
            range_end: prefix_end(prefix),
            ..Default::default()
        }
    }

    /// One key.
    pub(crate) fn key(key: &[u8]) -> Range {
        Range {
            key: key.to_vec(),
            ..Default::default()
        }
    }
}

impl TxnOp {
    /// Reads one key.
    ///
    /// ```
    /// let op = etcd_sync::TxnOp::get("k");
    /// # let _ = op;
    /// ```
    pub fn get(key: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp(Op::Range(Range::key(&key.into())))
    }

    /// Reads every key that starts with `prefix`.
    ///
    /// ```
    /// let op = etcd_sync::TxnOp::get_prefix("jobs/");
    /// # let _ = op;
    /// ```
    pub fn get_prefix(prefix: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp(Op::Range(Range::prefix(&prefix.into())))
    }

    pub(crate) fn range(range: Range) -> TxnOp {
        TxnOp(Op::Range(range))
    }

    /// Writes a key without a lease.
    ///
    /// ```
    /// let op = etcd_sync::TxnOp::put("k", "v");
    /// # let _ = op;
    /// ```
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp::put_with_lease(key, value, 0)
    }

    /// Writes a key bound to a lease (it disappears when the lease ends).
    ///
    /// ```
    /// let op = etcd_sync::TxnOp::put_with_lease("k", "v", 0x1234);
    /// # let _ = op;
    /// ```
    pub fn put_with_lease(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> TxnOp {
        TxnOp(Op::Put {
            key: key.into(),
            value: value.into(),
            lease,
        })
    }

    /// Deletes one key.
    ///
    /// ```
    /// let op = etcd_sync::TxnOp::delete("k");
    /// # let _ = op;
    /// ```
    pub fn delete(key: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp(Op::Delete { key: key.into() })
    }

    /// Runs a nested transaction (etcd 3.3+).
    ///
    /// ```
    /// use etcd_sync::{Txn, TxnOp};
    /// let op = TxnOp::txn(Txn::new().and_then([TxnOp::put("k", "v")]));
    /// # let _ = op;
    /// ```
    pub fn txn(txn: Txn) -> TxnOp {
        TxnOp(Op::Txn(txn))
    }
}

/// An etcd transaction: if every comparison holds, run the `and_then` operations, else the
/// `or_else` ones, atomically.
///
/// # Example
///
/// ```no_run
/// use etcd_sync::{Compare, CompareOp, Txn, TxnOp};
/// # fn main() -> etcd_sync::Result<()> {
/// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// // create "k" only if it does not exist yet
/// let response = client.txn(
///     Txn::new()
///         .when([Compare::create_revision("k", CompareOp::Equal, 0)])
///         .and_then([TxnOp::put("k", "first")])
///         .or_else([TxnOp::get("k")]),
/// )?;
/// println!("created: {}", response.succeeded);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Txn {
    pub(crate) when: Vec<Compare>,
    pub(crate) then: Vec<TxnOp>,
    pub(crate) otherwise: Vec<TxnOp>,
}

impl Txn {
    /// An empty transaction (no conditions, no operations).
    ///
    /// ```
    /// let txn = etcd_sync::Txn::new();
    /// # let _ = txn;
    /// ```
    pub fn new() -> Txn {
        Txn::default()
    }

    /// Adds conditions; all must hold for the `and_then` branch to run.
    ///
    /// ```
    /// use etcd_sync::{Compare, CompareOp, Txn};
    /// let txn = Txn::new().when([Compare::version("k", CompareOp::Equal, 0)]);
    /// # let _ = txn;
    /// ```
    pub fn when(mut self, compares: impl IntoIterator<Item = Compare>) -> Txn {
        self.when.extend(compares);
        self
    }

    /// Adds operations run when every condition holds.
    ///
    /// ```
    /// use etcd_sync::{Txn, TxnOp};
    /// let txn = Txn::new().and_then([TxnOp::put("k", "v")]);
    /// # let _ = txn;
    /// ```
    pub fn and_then(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Txn {
        self.then.extend(ops);
        self
    }

    /// Adds operations run when a condition fails.
    ///
    /// ```
    /// use etcd_sync::{Txn, TxnOp};
    /// let txn = Txn::new().or_else([TxnOp::get("k")]);
    /// # let _ = txn;
    /// ```
    pub fn or_else(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Txn {
        self.otherwise.extend(ops);
        self
    }
}

/// The outcome of a [`Txn`].
///
/// ```no_run
/// # fn main() -> etcd_sync::Result<()> {
/// # let client = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?;
/// let r = client.txn(etcd_sync::Txn::new().and_then([etcd_sync::TxnOp::get("k")]))?;
/// if let Some(etcd_sync::TxnOpResponse::Get(kvs)) = r.responses.first() {
///     println!("{} keys at revision {}", kvs.len(), r.revision);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct TxnResponse {
    /// Whether every condition held (the `and_then` branch ran).
    pub succeeded: bool,
    /// The store revision after the transaction.
    pub revision: i64,
    /// One response per operation of the branch that ran, in order.
    pub responses: Vec<TxnOpResponse>,
}

/// The result of one [`TxnOp`].
///
/// ```
/// let r = etcd_sync::TxnOpResponse::Delete { deleted: 1 };
/// assert!(matches!(r, etcd_sync::TxnOpResponse::Delete { deleted: 1 }));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TxnOpResponse {
    /// Keys read by a get.
    Get(Vec<KeyValue>),
    /// A put happened.
    Put,
    /// A delete removed this many keys.
    Delete {
        /// Number of keys removed.
        deleted: i64,
    },
    /// A nested transaction's result.
    Txn(TxnResponse),
}

/// A key or value for messages and logs: UTF-8, invalid bytes replaced.
pub(crate) fn text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

/// A lease id as etcd's tools print it: lowercase hex, as in the key `<name>/<lease hex>`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseHex(pub(crate) i64);

impl std::fmt::Display for LeaseHex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// The end of the key range that covers every key starting with `prefix`, etcd-style.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff (or the prefix was empty): "to the end of the keyspace".
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }
}
