//! The cluster's own loops: watchers catching up, leases expiring, progress notifications.

use std::sync::Arc;
use std::time::Duration;

use super::services::{self, Shared, State};
use super::{leases, watchers};

/// Unsynced watchers catch up every [`watchers::SYNC_INTERVAL`].
pub(super) async fn sync(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(watchers::SYNC_INTERVAL);
    loop {
        tick.tick().await;
        let mut state = shared.lock();
        let State {
            store, watchers, ..
        } = &mut *state;
        watchers.sync(store);
    }
}

/// The leader revokes expired leases every [`leases::EXPIRY_CHECK`].
pub(super) async fn expiry(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(leases::EXPIRY_CHECK);
    loop {
        tick.tick().await;
        let mut state = shared.lock();
        if state.leader.is_none() {
            continue;
        }
        for id in state.leases.expired(tokio::time::Instant::now()) {
            services::revoke(&mut state, id, true);
        }
    }
}

/// Progress notifications, every interval the cluster is set to (see
/// [`SimCluster::set_progress_interval`](super::SimCluster::set_progress_interval)).
pub(super) async fn progress(shared: Arc<Shared>) {
    loop {
        let interval = shared.lock().progress_interval;
        let Some(interval) = interval else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        tokio::time::sleep(interval).await;
        let mut state = shared.lock();
        let State {
            store, watchers, ..
        } = &mut *state;
        watchers.progress(store);
    }
}
