//! The simulation seam of the library's own code (feature `simulation`): what a simulated
//! run (`testing::sim`) changes inside the paths that decide who holds is reached through
//! the functions here, called with plain `if`s. Without the feature each is a constant
//! (`false`, `None`) or does nothing, `#[inline(always)]`, so the compiler removes the
//! branch; outside `testing/`, only the seam files listed in `docs/design/simulation-seams.md`
//! name the feature.
//!
//! - [`mutation`]: whether a defect this project once fixed is re-introduced (the
//!   mutation table, `tests/simulation_mutations.rs`, shows the simulation finds each one).
//! - [`mark`]: counts of rare paths a run's outcome reports (waits at the back, lookout
//!   gaps read).
//! - [`virtual_now`]: the run's virtual clock, for `support::clock`.
//! - [`Process`]: whether the simulated process a client belongs to has crashed.
//! - [`simulated!`]: items (unit tests) that exist only in a simulated build.

use std::time::Instant;

/// A defect this project once fixed, re-introduced on demand: the deterministic simulation
/// must find each one (`tests/simulation_mutations.rs`), which is how it shows it has teeth.
/// One at a time, process-wide: only a test binary that runs nothing else may switch one
/// on (`testing::sim::RunConfig::mutation`).
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
    /// A lock-delay runs after every lease ahead that ended, revoked or expired, as before
    /// issue 48, item 4: a holder that releases and then closes its session (a process
    /// exiting normally) costs its waiters the delay.
    DelayOnEveryEnd,
    /// A downgrade that finds its writer key gone takes its twin for the mark of an
    /// earlier copy of itself whatever the twin's mod revision, as before issue 48, item 2:
    /// a write lock whose writer key an operator deleted becomes a read guard.
    DowngradeTakesAnyGoneWriter,
    /// A hand-over's retried request that finds its own earlier copy there, applied
    /// unheard, refuses itself as "another hand-over", as before issue 52's first
    /// hand-over fix: the leader leads on, the hand-over fails without cause. Shown by the
    /// runs with the fault aimed at hand-overs (`RunConfig::handover_faults`).
    RetryRefusesOwnRequest,
}

#[cfg(feature = "simulation")]
impl Mutation {
    /// Every mutation, in the order of the teeth table in docs/design/simulation.md.
    ///
    /// ```
    /// assert_eq!(etcd_sync::testing::sim::Mutation::ALL.len(), 13);
    /// ```
    pub const ALL: [Mutation; 13] = [
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
        Mutation::DelayOnEveryEnd,
        Mutation::DowngradeTakesAnyGoneWriter,
        Mutation::RetryRefusesOwnRequest,
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
            Mutation::DelayOnEveryEnd => 12,
            Mutation::DowngradeTakesAnyGoneWriter => 13,
            Mutation::RetryRefusesOwnRequest => 14,
        }
    }
}

#[cfg(feature = "simulation")]
static ACTIVE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Switches `mutation` on (or every one off).
#[cfg(feature = "simulation")]
pub(crate) fn set(mutation: Option<Mutation>) {
    ACTIVE.store(
        mutation.map_or(0, Mutation::code),
        std::sync::atomic::Ordering::SeqCst,
    );
}

/// Whether `mutation` is on: always `false` without the `simulation` feature.
#[inline(always)]
pub(crate) fn mutation(mutation: Mutation) -> bool {
    #[cfg(feature = "simulation")]
    return ACTIVE.load(std::sync::atomic::Ordering::Relaxed) == mutation.code();
    #[cfg(not(feature = "simulation"))]
    {
        let _ = mutation;
        false
    }
}

/// A rare path a simulated run counts (process-wide), for its outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// A wait started at the back of a line, on a lookout key (`line/behind/`).
    BackWait,
    /// A read of a lookout's start gap, made when it was due (`line/behind/`).
    GapRead,
}

#[cfg(feature = "simulation")]
static MARKS: [std::sync::atomic::AtomicU64; 2] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

/// Counts `mark` in a simulated build; nothing without the `simulation` feature.
#[inline(always)]
pub(crate) fn mark(mark: Mark) {
    #[cfg(feature = "simulation")]
    MARKS[mark as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(feature = "simulation"))]
    let _ = mark;
}

/// How many times `mark` was counted in this process.
#[cfg(feature = "simulation")]
pub(crate) fn marked(mark: Mark) -> u64 {
    MARKS[mark as usize].load(std::sync::atomic::Ordering::Relaxed)
}

/// Now on tokio's clock, which is virtual in a simulated run (its paused runtime makes it
/// so for every thread that entered it) and the monotonic clock elsewhere; `None` without
/// the `simulation` feature (then `support::clock` reads the monotonic clock itself).
#[inline(always)]
pub(crate) fn virtual_now() -> Option<Instant> {
    #[cfg(feature = "simulation")]
    return Some(tokio::time::Instant::now().into_std());
    #[cfg(not(feature = "simulation"))]
    None
}

/// The simulated process a client belongs to (one per client): whether it crashed, after
/// which nothing of it reaches etcd any more (requests already on their way still may).
/// Without the `simulation` feature it is empty and never crashed.
#[derive(Debug, Default)]
pub(crate) struct Process {
    #[cfg(feature = "simulation")]
    crashed: std::sync::atomic::AtomicBool,
}

impl Process {
    /// Whether the process crashed: always `false` without the `simulation` feature.
    #[inline(always)]
    pub(crate) fn crashed(&self) -> bool {
        #[cfg(feature = "simulation")]
        return self.crashed.load(std::sync::atomic::Ordering::SeqCst);
        #[cfg(not(feature = "simulation"))]
        false
    }

    /// Crashes the process (a simulated run's restart of it).
    #[cfg(feature = "simulation")]
    pub(crate) fn crash(&self) {
        self.crashed
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Items that exist only in a simulated build (unit tests that need its virtual clock):
/// `crate::support::sim::simulated! { mod tests { ... } }`.
#[cfg(test)]
macro_rules! simulated {
    ($($item:item)*) => {
        $(
            #[cfg(feature = "simulation")]
            $item
        )*
    };
}
#[cfg(test)]
pub(crate) use simulated;
