//! The run's history of lock operations, for a check from outside the crate (issue 52: a
//! linearizability checker against a sequential fenced lock, `tests/fenced/`): who took
//! which name with which token, what each release and each look at the store found, and
//! what outside the holders could remove a key (an operator delete, a lease's end, a
//! removal sent and never answered). Positions are the run's own order: one thread runs at
//! a time, so a counter orders every call and return exactly.

use super::World;

/// How a hold shares its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A mutex, a write lock or leadership: alone.
    Exclusive,
    /// A read lock: with other readers.
    Shared,
    /// One permit of a semaphore of this many.
    Permit(u32),
}

/// What an operation did (with its outcome: every operation here has one kind of answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// A wait returned a guard on `lease` with fencing token `token`.
    Acquire {
        /// How it shares the name.
        mode: Mode,
        /// The lease its key is bound to.
        lease: i64,
        /// Its key's create revision (its fencing token, but for a leadership handed over,
        /// whose key is the old leader's).
        token: i64,
    },
    /// The holder of `token` released: `deleted` if etcd deleted our key by it (`Ok`),
    /// else the key was gone already (`LockLost`). A release with no answer is a
    /// [`What::Remove`] that never returned.
    Release {
        /// The hold's fencing token.
        token: i64,
        /// The releasing guard's lease (for a leadership handed to it, not its key's name):
        /// a release deletes the key only while it is on this lease.
        lease: i64,
        /// Whether the release deleted the key.
        deleted: bool,
    },
    /// The write hold of `token` went on as a read, with no gap (a downgrade).
    Downgrade {
        /// The hold's fencing token (the read's too).
        token: i64,
    },
    /// The simulation looked at the store while holding `token`: is its key there?
    Observe {
        /// The hold's fencing token.
        token: i64,
        /// Whether the key was there, with that create revision.
        present: bool,
    },
    /// The leader of `token` handed its leadership over: the hold goes on, on `lease`
    /// (the successor's); its key keeps its create revision.
    HandOver {
        /// The hold's key's create revision.
        token: i64,
        /// The successor's lease.
        lease: i64,
    },
    /// The key of `token` may be removed: a release that etcd did not answer, or a hold
    /// whose end the run does not follow (a leader loop's resignation).
    Remove {
        /// The hold's fencing token.
        token: i64,
    },
    /// An operator deleted every key under the name.
    RemoveAll,
    /// `lease` ended (revoked, or left to expire): its keys go, and it holds nothing again.
    EndLease {
        /// The lease.
        lease: i64,
    },
    /// A process crashed: what it had sent and not seen answered may still apply, late, to
    /// the keys of `lease` created up to revision `upto`.
    Crashed {
        /// The crashed process's lease (resumed by its next life).
        lease: i64,
        /// The store's revision at the crash.
        upto: i64,
    },
}

/// One operation of the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// Who called it: `p<N>` (a process: one caller at a time) or `nemesis`.
    pub actor: String,
    /// The name it concerns (`None`: every name, as a lease's end).
    pub name: Option<&'static str>,
    /// What it did.
    pub what: What,
    /// Its call's position in the run.
    pub called: u64,
    /// Its return's position; `None` if it never returned (it may take effect at any
    /// point after its call, or never).
    pub returned: Option<u64>,
}

impl World {
    /// The next position in the run's order (a call's or a return's).
    pub(super) fn tick(&self) -> u64 {
        let mut log = self.log();
        log.clock += 1;
        log.clock
    }

    /// Records an operation called at `called` that returns now (or never: `returned`
    /// false).
    pub(super) fn record(
        &self,
        actor: &str,
        name: Option<&'static str>,
        what: What,
        (called, returned): (u64, bool),
    ) {
        let returned = returned.then(|| self.tick());
        self.log().outcome.history.push(Operation {
            actor: actor.to_string(),
            name,
            what,
            called,
            returned,
        });
    }

    /// The session of `lease` is alive now (a guard of it holds): its lease cannot end
    /// before (the client's deadline comes before the server's expiry).
    pub(super) fn alive(&self, lease: i64) {
        let at = self.tick();
        self.log().alive.insert(lease, at);
    }

    /// Records that `lease` may end from the last moment it was known alive on (its
    /// session was seen lost): never returns.
    pub(super) fn lease_lost(&self, actor: &str, lease: i64) {
        let known = self.log().alive.get(&lease).copied();
        let called = known.unwrap_or_else(|| self.tick());
        self.record(actor, None, What::EndLease { lease }, (called, false));
    }

    /// Records an operation that took no time (a look at the store, a nemesis step).
    pub(super) fn record_now(&self, actor: &str, name: Option<&'static str>, what: What) {
        let called = self.tick();
        self.record(actor, name, what, (called, true));
    }
}
