//! The members' KV hashes at the end of a run: a violation is ours only if etcd's members
//! agree on the history.

use std::time::Duration;

use etcd_sync::{Client, Txn};

/// Whether every member hashes the same key-value history up to the current revision.
///
/// etcd's HashKV covers the history from the member's compaction revision on, so two
/// members agree only if their hashes match at the same compaction revision (etcd's own
/// corruption check compares them that way). With auto-compaction running, a member may
/// not have applied the latest compaction yet: ask again until they line up, and compare
/// the members that share a compaction revision if they never do.
pub(crate) fn members_agree(c: &Client, endpoints: &[String]) -> Result<(), String> {
    let mut last = Vec::new();
    for attempt in 0..10 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(500));
        }
        let revision = c.txn(Txn::new()).map_err(|e| e.to_string())?.revision;
        let out = std::process::Command::new(
            etcd_sync::testing::etcdctl_binary().map_err(|e| e.to_string())?,
        )
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(["endpoint", "hashkv", "-w", "json"])
        .arg(format!("--rev={revision}"))
        .output()
        .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        // (hash, compact revision) per member.
        let hashes: Vec<(u64, i64)> = text
            .split("\"hash\":")
            .skip(1)
            .filter_map(|rest| {
                let hash = leading_number(rest)?;
                let compact = rest
                    .split("\"compact_revision\":")
                    .nth(1)
                    .and_then(leading_number);
                Some((hash as u64, compact.unwrap_or(0)))
            })
            .collect();
        println!(
            "CHECKER member hashes at revision {revision} (hash, compact revision): {hashes:?}"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        if hashes.len() != endpoints.len() && stderr.contains("compacted") && attempt < 9 {
            // An idle cluster's periodic compaction reached the revision just read: write
            // once, so that the next attempt asks for a revision it has not compacted.
            let _ = c.put("checker-hash-bump", attempt.to_string());
            continue;
        }
        if hashes.len() != endpoints.len() {
            return Err(format!(
                "etcdctl endpoint hashkv answered for {} of {} members: {text} {}",
                hashes.len(),
                endpoints.len(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let same_compaction = hashes.windows(2).all(|w| w[0].1 == w[1].1);
        // Members at one compaction revision must agree, whatever the others say.
        for (i, a) in hashes.iter().enumerate() {
            if let Some(b) = hashes[i + 1..].iter().find(|b| b.1 == a.1 && b.0 != a.0) {
                return Err(format!(
                    "etcd members disagree on the history at revision {revision} \
                     (both compacted at {}: hashes {} and {}): {text}",
                    a.1, a.0, b.0
                ));
            }
        }
        if same_compaction {
            return Ok(());
        }
        last = hashes;
    }
    println!(
        "CHECKER member hashes: compaction revisions never lined up ({last:?}); \
         compared only members that shared one"
    );
    Ok(())
}

/// The decimal number at the start of `text` (a JSON value).
fn leading_number(text: &str) -> Option<i64> {
    let digits: String = text.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}
