//! Test tuning of how waiters wait: a hidden builder option
//! (`ClientBuilder::line_tuning`, feature `testing`) that the randomized checker's worker
//! processes and the simulation set, so that their short lines also wait at the back of
//! the line (`line/behind/`), under every fault they inject. The library reads no
//! environment variable for it: a test passes it to the builder.

/// Overrides of the widths of `line/behind/` for one client (`None`: the library's own).
/// Not part of the API: for the crate's own tests.
///
/// ```
/// let narrow = etcd_sync::testing::LineTuning { front: Some(1), ..Default::default() };
/// assert_eq!(narrow.far_start, None);
/// ```
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LineTuning {
    /// Replaces `FRONT`, how many keys ahead a waiter at the front may have (and caps
    /// `LOOKOUT_LEAVES`).
    pub front: Option<usize>,
    /// Replaces `FAR_START`, how far a lookout must be for its watcher to start from the
    /// revision its waiter read, with no read.
    pub far_start: Option<usize>,
    /// Replaces `POLL_NEAR`, how far a lookout may be for its waiter to poll it while etcd
    /// may still be syncing its watcher (farther: its start gap is read once, late).
    pub poll_near: Option<usize>,
}
