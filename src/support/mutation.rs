//! Defects this project once fixed, re-introduced on demand (feature `simulation`): the
//! deterministic simulation must find each one (`tests/simulation_mutations.rs`), which is
//! how it shows it has teeth. One at a time, process-wide: only a test binary that runs
//! nothing else may switch one on.

use std::sync::atomic::{AtomicU8, Ordering};

/// A defect to re-introduce (see [`testing::sim::RunConfig::mutation`](crate::testing::sim::RunConfig::mutation)).
///
/// ```
/// use etcd_sync::testing::sim::Mutation;
/// assert_ne!(Mutation::ResumeCompacted, Mutation::EnqueueWithoutCondition);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mutation {
    /// A watcher whose resume revision was compacted goes on from the compact revision as
    /// if nothing was missed, instead of starting again and telling its subscribers to
    /// read (the compaction wedge of issue 18).
    ResumeCompacted,
    /// The enqueue Txn puts our key without its "does not exist yet" compare, so a retry
    /// after an ambiguous attempt takes an existing key for a new one (issue 10's
    /// exactly-once rule).
    EnqueueWithoutCondition,
    /// A lock-delay runs to its end even when our key is deleted meanwhile, and the wait
    /// returns a guard for a key that is gone (issue 25).
    DelayIgnoresDeletion,
    /// The cleanup after an ambiguous enqueue lets go of the line's turn before its
    /// removal is answered, so the next acquire of the session races it.
    CleanupWithoutTurn,
    /// The cleanup after an ambiguous enqueue deletes "our lease's key" whatever its
    /// revision, so a copy of it that etcd applies late deletes the session's next key
    /// (found by this simulation, and fixed: `removal::remove_if_leased`).
    CleanupByLease,
    /// A re-campaign on the same session and name hands the hold to a new guard without
    /// superseding the old one: two live guards over one key, and the first one dropped
    /// deletes the key under the other.
    ReCampaignAliases,
    /// A release (and every removal behind it) deletes our key whatever its create
    /// revision, so a retried or late-applied release deletes a newer key of that name
    /// (upstream #22082).
    UnguardedRelease,
    /// A wait that ends on its limit or cancel token returns at once, before etcd answered
    /// the removal of the key it queued: the caller sees the name still blocked by it.
    CancelReturnsEarly,
    /// A release deletes our key but not its release request (`<name>.revoke/…`), which
    /// then outlives the hold it was for, until the session ends.
    ReleaseKeepsRequest,
    /// A watcher resumes right after the last revision it saw on every member, also on
    /// one without etcd #18089's fix, which then loses a delete at exactly its compact
    /// revision (defect 5 of docs/design/simulation.md, back where the member's version
    /// decides).
    ResumeAfterOnEveryRelease,
    /// A waiter at the back never reads its lookout's start gap (the revisions between its
    /// read of the line and its lookout watcher's start), so a lookout deleted there, out of
    /// order, is never seen and the waiter misses its turn. Not in [`Mutation::ALL`]: only
    /// lines that wait at the back can show it, and the simulation's lines are short, so
    /// `tests/simulation_back.rs` finds it with the front narrowed to one key.
    LookoutGapUnread,
}

impl Mutation {
    /// Every mutation, in the order of the teeth table in docs/design/simulation.md.
    ///
    /// ```
    /// assert_eq!(etcd_sync::testing::sim::Mutation::ALL.len(), 10);
    /// ```
    pub const ALL: [Mutation; 10] = [
        Mutation::ResumeCompacted,
        Mutation::EnqueueWithoutCondition,
        Mutation::DelayIgnoresDeletion,
        Mutation::CleanupWithoutTurn,
        Mutation::CleanupByLease,
        Mutation::ReCampaignAliases,
        Mutation::UnguardedRelease,
        Mutation::CancelReturnsEarly,
        Mutation::ReleaseKeepsRequest,
        Mutation::ResumeAfterOnEveryRelease,
    ];

    fn code(self) -> u8 {
        match self {
            Mutation::ResumeCompacted => 1,
            Mutation::EnqueueWithoutCondition => 2,
            Mutation::DelayIgnoresDeletion => 3,
            Mutation::CleanupWithoutTurn => 4,
            Mutation::CleanupByLease => 5,
            Mutation::ReCampaignAliases => 6,
            Mutation::UnguardedRelease => 7,
            Mutation::CancelReturnsEarly => 8,
            Mutation::ReleaseKeepsRequest => 9,
            Mutation::ResumeAfterOnEveryRelease => 10,
            Mutation::LookoutGapUnread => 11,
        }
    }
}

static ACTIVE: AtomicU8 = AtomicU8::new(0);

/// Switches `mutation` on (or every one off).
pub(crate) fn set(mutation: Option<Mutation>) {
    ACTIVE.store(mutation.map_or(0, Mutation::code), Ordering::SeqCst);
}

/// Whether `mutation` is on.
pub(crate) fn active(mutation: Mutation) -> bool {
    ACTIVE.load(Ordering::Relaxed) == mutation.code()
}
