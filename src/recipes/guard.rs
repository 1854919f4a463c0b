//! The surface every lock guard shares ([`MutexGuard`](crate::MutexGuard),
//! [`RwLockReadGuard`](crate::RwLockReadGuard), [`RwLockWriteGuard`](crate::RwLockWriteGuard),
//! [`Permit`](crate::Permit)): written once, as a macro, so the four cannot drift apart.
//! Each guard wraps a [`Held`](crate::ownership::Held) and differs only in its name, how
//! it is acquired (for the examples) and the name of its explicit release.
//!
//! [`Leadership`](crate::Leadership) is not one of them: it can be superseded by a
//! re-campaign, reports `NotLeader`, and resigns through `&mut self`.

/// Defines a lock guard type with the shared surface.
///
/// * `$guard`: the type; `$what`: what it holds, for the docs ("lock", "read lock"...);
/// * `$get`: an expression that yields one, for the examples (with `session` in scope);
/// * `$release`: the name of the method that releases and reports the outcome.
macro_rules! lock_guard {
    (
        $(#[$meta:meta])*
        $guard:ident, what = $what:literal, get = $get:literal, release = $release:ident
    ) => {
        $(#[$meta])*
        #[must_use = "the lock is released as soon as the guard is dropped"]
        pub struct $guard {
            held: $crate::ownership::Held,
        }

        impl ::std::fmt::Debug for $guard {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($guard))
                    .field("key", &self.key_str())
                    .field("fencing_token", &self.held.rev())
                    .finish()
            }
        }

        impl $guard {
            #[doc = concat!("The ", $what, "'s key in etcd: `<name>/<lease id in hex>`, with a")]
            /// suffix for shared keys and permits (`.shared`, `.permits-<N>`).
            ///
            /// ```no_run
            /// # fn main() -> etcd_sync::Result<()> {
            /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
            #[doc = concat!("let guard = ", $get, ";")]
            /// assert!(guard.key().starts_with(b"m/"));
            /// # Ok(()) }
            /// ```
            pub fn key(&self) -> &[u8] {
                self.held.key()
            }

            #[doc = concat!("The ", $what, "'s key as text.")]
            ///
            /// ```no_run
            /// # fn main() -> etcd_sync::Result<()> {
            /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
            #[doc = concat!("println!(\"{}\", ", $get, ".key_str());")]
            /// # Ok(()) }
            /// ```
            pub fn key_str(&self) -> ::std::borrow::Cow<'_, str> {
                $crate::support::kv::text(self.key())
            }

            /// The fencing token: our key's create revision. It grows with every acquisition
            /// under the name, so storage that remembers the highest token it has seen can
            /// reject a write from a holder that has since lost its hold.
            ///
            /// ```no_run
            /// # fn main() -> etcd_sync::Result<()> {
            /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
            #[doc = concat!("let first = ", $get, ".fencing_token();")]
            #[doc = concat!("let second = ", $get, ".fencing_token();")]
            /// assert!(second > first);
            /// # Ok(()) }
            /// ```
            pub fn fencing_token(&self) -> i64 {
                self.held.rev()
            }

            #[doc = concat!("Whether the ", $what, " is still held as far as this process knows: not")]
            /// released, the session's lease deadline has not passed, and our key has not been
            /// seen deleted. No request is sent; use a guarded write to have etcd confirm.
            ///
            /// ```no_run
            /// # fn main() -> etcd_sync::Result<()> {
            /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
            #[doc = concat!("let guard = ", $get, ";")]
            /// assert!(guard.is_held());
            /// # Ok(()) }
            /// ```
            pub fn is_held(&self) -> bool {
                self.held.is_held()
            }

            #[doc = concat!("A channel that becomes ready (disconnected) when the ", $what, " may be lost or")]
            /// is given up: the session's lease deadline passed or the session ended, our key
            /// was seen deleted, or the guard was released. Nothing is ever sent on it.
            ///
            /// ```no_run
            /// # fn main() -> etcd_sync::Result<()> {
            /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
            #[doc = concat!("let guard = ", $get, ";")]
            /// let lost = guard.lost();
            /// std::thread::spawn(move || { let _ = lost.recv(); eprintln!("lost it"); });
            /// # Ok(()) }
            /// ```
            pub fn lost(&self) -> ::crossbeam_channel::Receiver<()> {
                self.held.lost()
            }

            #[doc = concat!("The condition \"we still hold this ", $what, "\" (our key still has our create")]
            /// revision), to add to your own transactions: Go's `Mutex.IsOwner()`.
            ///
            /// ```no_run
            /// use etcd_sync::{Txn, TxnOp};
            /// # fn main() -> etcd_sync::Result<()> {
            /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
            #[doc = concat!("let guard = ", $get, ";")]
            /// let r = session.client().txn(
            ///     Txn::new().when([guard.ownership_compare()]).and_then([TxnOp::put("k", "v")]),
            /// )?;
            /// assert!(r.succeeded);
            /// # Ok(()) }
            /// ```
            pub fn ownership_compare(&self) -> $crate::support::kv::Compare {
                $crate::support::kv::Compare::create_revision(
                    self.key().to_vec(),
                    $crate::support::kv::CompareOp::Equal,
                    self.held.rev(),
                )
            }

            #[doc = concat!("Puts `key = value` only while we hold the ", $what, "; [`Error::LockLost`](crate::Error::LockLost)")]
            /// otherwise. Returns the store revision of the write, as
            /// [`Client::put`](crate::Client::put) does (use `txn` for the whole response).
            ///
            /// # Errors
            ///
            /// * [`Error::LockLost`](crate::Error::LockLost): our key no longer has our create
            ///   revision (deleted by someone else, or gone with the session's lease);
            ///   nothing was written.
            /// * [`Error::SessionLost`](crate::Error::SessionLost): the session is known lost
            ///   (etcd said so, or no keep-alive was acknowledged before the lease
            ///   deadline); nothing was sent.
            /// * [`Error::InvalidArgument`](crate::Error::InvalidArgument): `key` is empty;
            ///   nothing was sent.
            /// * [`Error::Timeout`](crate::Error::Timeout) /
            ///   [`Error::Unavailable`](crate::Error::Unavailable): etcd did not answer. Not
            ///   retried: the write may or may not have been applied.
            /// * [`Error::Server`](crate::Error::Server): etcd refused the transaction (e.g.
            ///   `PermissionDenied`, or `InvalidArgument` for a value above its size limit);
            ///   [`Error::Authentication`](crate::Error::Authentication): re-authenticating
            ///   after an expired token failed.
            /// * [`Error::InsideAsyncRuntime`](crate::Error::InsideAsyncRuntime): called on an
            ///   async worker thread.
            ///
            /// ```no_run
            /// # fn main() -> etcd_sync::Result<()> {
            /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
            #[doc = concat!("let guard = ", $get, ";")]
            /// let revision = guard.put("state", "written by the holder")?;
            /// assert!(revision > 0);
            /// # Ok(()) }
            /// ```
            pub fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> $crate::support::error::Result<i64> {
                self.held.put(key.as_ref(), value.as_ref())?.ok_or($crate::support::error::Error::LockLost)
            }

            #[doc = concat!("Deletes `key` only while we hold the ", $what, "; [`Error::LockLost`](crate::Error::LockLost)")]
            /// otherwise. Returns the number of keys deleted (0 or 1), as
            /// [`Client::delete`](crate::Client::delete) does.
            ///
            /// # Errors
            ///
            /// As `put`.
            ///
            /// ```no_run
            /// # fn main() -> etcd_sync::Result<()> {
            /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
            #[doc = concat!("let guard = ", $get, ";")]
            /// guard.delete("state")?;
            /// # Ok(()) }
            /// ```
            pub fn delete(&self, key: impl AsRef<[u8]>) -> $crate::support::error::Result<i64> {
                self.held.delete(key.as_ref())?.ok_or($crate::support::error::Error::LockLost)
            }

            #[doc = concat!("Runs `txn` only while we hold the ", $what, ", atomically with that check;")]
            /// returns `txn`'s own response, or [`Error::LockLost`](crate::Error::LockLost).
            /// A failed comparison of `txn` itself is not an error: `Ok` with
            /// `succeeded == false`.
            ///
            /// # Errors
            ///
            /// As `put`, except that an empty key is etcd's
            /// [`Error::Server`](crate::Error::Server) with code `InvalidArgument`.
            ///
            /// ```no_run
            /// use etcd_sync::{Compare, CompareOp, Txn, TxnOp};
            /// # fn main() -> etcd_sync::Result<()> {
            /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
            #[doc = concat!("let guard = ", $get, ";")]
            /// let r = guard.txn(
            ///     Txn::new()
            ///         .when([Compare::version("job", CompareOp::Equal, 0)])
            ///         .and_then([TxnOp::put("job", "started")]),
            /// )?;
            /// println!("started: {}", r.succeeded);
            /// # Ok(()) }
            /// ```
            pub fn txn(&self, txn: $crate::support::kv::Txn) -> $crate::support::error::Result<$crate::support::kv::TxnResponse> {
                self.held.guarded_txn(txn)?.ok_or($crate::support::error::Error::LockLost)
            }

            #[doc = concat!("Releases the ", $what, " and reports the outcome: [`Error::LockLost`](crate::Error::LockLost) if")]
            /// it was no longer ours (nothing was deleted then), or the request's error.
            /// Returns within about one request timeout; if etcd has not answered by then,
            /// the release goes on in the background (the next acquisition of this session
            /// and name waits for it) and this returns [`Error::Timeout`](crate::Error::Timeout).
            ///
            /// It takes the guard by value, like `parking_lot`'s `MutexGuard::unlock`: after
            /// it the hold is over whatever the outcome. Dropping the guard releases too,
            /// without reporting.
            ///
            /// # Errors
            ///
            /// * [`Error::LockLost`](crate::Error::LockLost): our key was seen deleted, or it
            ///   no longer had our create revision (deleted by someone else, or gone with
            ///   the session's revoked or closed lease). Nothing was deleted.
            /// * [`Error::Timeout`](crate::Error::Timeout) with
            ///   [`Operation::Release`](crate::Operation::Release): etcd did not answer
            ///   within the request timeout; the release goes on.
            /// * [`Error::SessionLost`](crate::Error::SessionLost): the session is lost and
            ///   etcd could not be reached; the key goes with the lease.
            /// * [`Error::Server`](crate::Error::Server) /
            ///   [`Error::Authentication`](crate::Error::Authentication): etcd refused the
            ///   delete.
            /// * [`Error::InsideAsyncRuntime`](crate::Error::InsideAsyncRuntime): called on an
            ///   async worker thread (the guard is dropped, and its `Drop` releases in the
            ///   background).
            ///
            /// ```no_run
            /// # fn main() -> etcd_sync::Result<()> {
            /// # let session = etcd_sync::Client::connect(["http://127.0.0.1:2379"])?.session()?;
            #[doc = concat!("let guard = ", $get, ";")]
            #[doc = concat!("guard.", stringify!($release), "()?;")]
            /// # Ok(()) }
            /// ```
            pub fn $release(mut self) -> $crate::support::error::Result<()> {
                self.held.release_now()
            }
        }
    };
}

pub(crate) use lock_guard;
