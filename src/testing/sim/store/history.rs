//! Compaction and the history a watcher catches up from.

use super::{Change, Refusal, Store, Version, in_range};
use crate::transport::generated::mvccpb;

impl Store {
    /// Compacts every revision before `rev`: reads and watchers from before it are refused.
    pub(crate) fn compact(&mut self, rev: i64) -> Result<(), Refusal> {
        if rev <= self.compacted {
            return Err(Refusal::COMPACTED);
        }
        if rev > self.rev {
            return Err(Refusal::FUTURE_REV);
        }
        self.compacted = rev;
        let keeps_tombstone = self.keeps_compacted_tombstones;
        self.keys.retain(|_, versions| {
            // Keep the newest state at or before `rev` (if a value) and everything after.
            let keep_from = versions.iter().rposition(|v| v.rev <= rev).unwrap_or(0);
            versions.drain(..keep_from);
            let dropped =
                |v: &Version| v.kv.is_none() && (v.rev < rev || v.rev == rev && !keeps_tombstone);
            if versions.first().is_some_and(dropped) {
                versions.remove(0);
            }
            !versions.is_empty()
        });
        Ok(())
    }

    /// The changes in `[from, newest]` to keys in `[key, end)`, in order; `Err(compacted)`
    /// if revisions from `from` on were compacted (etcd: a watcher's start before the
    /// compact revision).
    pub(crate) fn changes_since(
        &self,
        from: i64,
        key: &[u8],
        end: &[u8],
    ) -> Result<Vec<Change>, i64> {
        if from < self.compacted {
            return Err(self.compacted);
        }
        let mut changes: Vec<Change> = self
            .keys
            .iter()
            .filter(|(k, _)| in_range(key, end, k))
            .flat_map(|(k, versions)| {
                versions
                    .iter()
                    .enumerate()
                    .filter(move |(_, v)| v.rev >= from)
                    .map(move |(i, v)| {
                        let prev = i
                            .checked_sub(1)
                            .and_then(|p| versions.get(p))
                            .and_then(|p| p.kv.clone());
                        let (r#type, kv) = match &v.kv {
                            Some(kv) => (mvccpb::event::EventType::Put, kv.clone()),
                            None => (
                                mvccpb::event::EventType::Delete,
                                mvccpb::KeyValue {
                                    key: k.clone(),
                                    mod_revision: v.rev,
                                    ..Default::default()
                                },
                            ),
                        };
                        Change {
                            rev: v.rev,
                            sub: v.sub,
                            event: mvccpb::Event {
                                r#type: r#type as i32,
                                kv: Some(kv),
                                prev_kv: prev,
                            },
                        }
                    })
            })
            .collect();
        changes.sort_by_key(|c| (c.rev, c.sub));
        Ok(changes)
    }
}
