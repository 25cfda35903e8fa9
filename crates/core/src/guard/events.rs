//! The guard's append-only event log: one chain per lineage in SQLite, each
//! event sealed with blake3 over its content and the previous event's seal,
//! and each kind writable only by its producer.

use serde_json::Value;

use super::ledger::Ledger;
use crate::canonical::canonical_json;
use crate::store::StoreError;

/// Who may write which kind of event.
pub const PRODUCERS: [(&str, &[&str]); 4] = [
    ("rollout_engine", &["generation"]),
    ("verifier", &["reward"]),
    ("materializer", &["envelope", "decision"]),
    (
        "control",
        &["sync", "update_prepared", "update_unguarded", "update_applied", "update_committed", "update_aborted"],
    ),
];

#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("producer '{producer}' may not write '{kind}' events (only {owner} may)")]
    NotOwner { producer: String, kind: String, owner: String },
    #[error("unknown event kind '{0}'")]
    UnknownKind(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn seal(prev: &str, seq: i64, producer: &str, kind: &str, payload: &str) -> String {
    let mut h = blake3::Hasher::new();
    for part in [prev, &seq.to_string(), producer, kind, payload] {
        h.update(part.as_bytes());
        h.update(b"\0");
    }
    h.finalize().to_hex().to_string()
}

/// Appends an event, refusing a kind its producer does not own. Returns the seal.
pub fn append(
    ledger: &mut Ledger,
    lineage: &str,
    producer: &str,
    kind: &str,
    payload: &Value,
) -> Result<String, EventError> {
    let owner = PRODUCERS
        .iter()
        .find(|(_, kinds)| kinds.contains(&kind))
        .map(|(p, _)| *p)
        .ok_or_else(|| EventError::UnknownKind(kind.into()))?;
    if owner != producer {
        return Err(EventError::NotOwner { producer: producer.into(), kind: kind.into(), owner: owner.into() });
    }
    Ok(ledger.append_event(lineage, producer, kind, &canonical_json(payload), seal)?)
}

/// Checks a lineage's chain: contiguous order, links and seals. The first
/// problem found, precisely, or `None` when intact.
pub fn verify(ledger: &Ledger, lineage: &str) -> Result<Option<String>, StoreError> {
    let mut prev = "genesis".to_string();
    for (i, event) in ledger.events(lineage)?.into_iter().enumerate() {
        let super::ledger::StoredEvent { seq, producer, kind, payload, prev: stored_prev, seal: stored_seal } = event;
        let expected_seq = i as i64 + 1;
        if seq != expected_seq {
            return Ok(Some(format!("event {expected_seq} is missing or out of order (found {seq})")));
        }
        if stored_prev != prev {
            return Ok(Some(format!(
                "event {seq} does not follow event {}: events were removed or reordered",
                seq - 1
            )));
        }
        if seal(&prev, seq, &producer, &kind, &payload) != stored_seal {
            return Ok(Some(format!("event {seq} ({kind}) was edited: its seal does not match its content")));
        }
        prev = stored_seal;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn log() -> (tempfile::TempDir, Ledger) {
        let dir = tempfile::tempdir().unwrap();
        let ws = crate::store::Workspace::open(dir.path()).unwrap();
        let mut index = Ledger::open(&ws).unwrap();
        for (producer, kind, v) in [
            ("control", "sync", 1),
            ("rollout_engine", "generation", 2),
            ("verifier", "reward", 3),
            ("materializer", "decision", 4),
        ] {
            append(&mut index, "L", producer, kind, &json!({"v": v})).unwrap();
        }
        (dir, index)
    }

    #[test]
    fn an_intact_chain_verifies() {
        let (_d, index) = log();
        assert_eq!(verify(&index, "L").unwrap(), None);
    }

    #[test]
    fn an_edited_a_removed_and_a_reordered_event_are_each_named() {
        let (_d, index) = log();
        index.execute_raw(r#"UPDATE guard_events SET payload = '{"v":9}' WHERE seq = 2"#).unwrap();
        assert_eq!(
            verify(&index, "L").unwrap().unwrap(),
            "event 2 (generation) was edited: its seal does not match its content"
        );
        let (_d, index) = log();
        index.execute_raw("DELETE FROM guard_events WHERE seq = 3").unwrap();
        assert_eq!(verify(&index, "L").unwrap().unwrap(), "event 3 is missing or out of order (found 4)");
        let (_d, index) = log();
        // Swap the content of events 2 and 3 (their seq numbers stay in place).
        index.execute_raw("UPDATE guard_events SET seq = -2 WHERE seq = 2").unwrap();
        index.execute_raw("UPDATE guard_events SET seq = 2 WHERE seq = 3").unwrap();
        index.execute_raw("UPDATE guard_events SET seq = 3 WHERE seq = -2").unwrap();
        let problem = verify(&index, "L").unwrap().unwrap();
        assert!(
            problem.contains("out of order") || problem.contains("does not follow") || problem.contains("was edited"),
            "{problem}"
        );
    }

    #[test]
    fn only_a_kinds_producer_may_write_it() {
        let (_d, mut index) = log();
        let err = append(&mut index, "L", "control", "generation", &json!({})).unwrap_err().to_string();
        assert_eq!(err, "producer 'control' may not write 'generation' events (only rollout_engine may)");
        assert!(append(&mut index, "L", "control", "mystery", &json!({})).is_err());
    }
}
