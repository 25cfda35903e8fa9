//! The guard's append-only event log: one chain per lineage in SQLite, each
//! event sealed with blake3 over its content and the previous event's seal,
//! and each kind writable only by its producer.

use serde::{Deserialize, Serialize, Serializer};

use super::codes::Decision;
use super::ledger::{seal, Ledger};
use crate::canonical::to_canonical_json;
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
    #[error("unknown event producer '{0}'")]
    UnknownProducer(String),
    #[error("a '{kind}' event's payload does not read: {message}")]
    Payload { kind: String, message: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What the rollout engine writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "payload", rename_all = "snake_case")]
pub enum RolloutEngineEvent {
    /// An iteration's rollouts were generated.
    Generation(Generation),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generation {
    pub iteration: usize,
    /// The rollout ids `[first, end)`.
    pub rollouts: [u64; 2],
    pub policy_version: u64,
    pub policy_digest: String,
    /// Each rollout's token-artifact hash.
    pub artifacts: Vec<String>,
}

/// What the verifier writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "payload", rename_all = "snake_case")]
pub enum VerifierEvent {
    /// An iteration's responses were scored.
    Reward(Reward),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reward {
    pub iteration: usize,
    pub verifier: String,
    pub protocol_hash: String,
    pub rewards: Vec<f64>,
}

/// What the materializer writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "payload", rename_all = "snake_case")]
pub enum MaterializerEvent {
    /// The envelopes an iteration's batch was built from.
    Envelope(EnvelopeDigests),
    /// The guard's decision on an iteration's batch.
    Decision(BatchDecision),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeDigests {
    pub iteration: usize,
    /// Each envelope's blake3.
    pub envelopes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchDecision {
    pub iteration: usize,
    pub decision: Decision,
    /// An allowed batch: its hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    /// A refused batch: the reason codes' ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codes: Option<Vec<String>>,
}

/// What the trainer's control loop writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "payload", rename_all = "snake_case")]
pub enum ControlEvent {
    /// The rollout engine took the trainer's weights.
    Sync(PolicySync),
    /// A validated batch's single-use handle was issued for this update.
    UpdatePrepared(Prepared),
    /// An update on a batch the guard did not validate (`guard: off`).
    UpdateUnguarded(Unguarded),
    UpdateApplied(UpdateRef),
    /// An update, or a checkpoint after an iteration, was committed.
    UpdateCommitted(Committed),
    UpdateAborted(UpdateRef),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySync {
    pub iteration: usize,
    pub trainer_version: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prepared {
    pub iteration: usize,
    pub update: usize,
    pub nonce: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unguarded {
    pub iteration: usize,
    pub update: usize,
    pub guard: GuardOff,
}

/// The guard's setting an unguarded update was made under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuardOff {
    Off,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateRef {
    pub iteration: usize,
    pub update: usize,
}

/// An update committed (`update`), or the checkpoint after an iteration (`checkpoint`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Committed {
    pub iteration: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<usize>,
}

/// A guard event, typed: one enum per producer, so a producer can write only
/// its own kinds. The sealed payload is the canonical JSON of the kind's
/// fields (the bytes the untyped events had, so chains logged before verify
/// and read).
#[derive(Debug, Clone, PartialEq)]
pub enum GuardEvent {
    RolloutEngine(RolloutEngineEvent),
    Verifier(VerifierEvent),
    Materializer(MaterializerEvent),
    Control(ControlEvent),
}

impl GuardEvent {
    pub fn producer(&self) -> &'static str {
        match self {
            GuardEvent::RolloutEngine(_) => "rollout_engine",
            GuardEvent::Verifier(_) => "verifier",
            GuardEvent::Materializer(_) => "materializer",
            GuardEvent::Control(_) => "control",
        }
    }

    /// The event's kind, as the log stores it.
    pub fn kind(&self) -> &'static str {
        match self {
            GuardEvent::RolloutEngine(RolloutEngineEvent::Generation(_)) => "generation",
            GuardEvent::Verifier(VerifierEvent::Reward(_)) => "reward",
            GuardEvent::Materializer(MaterializerEvent::Envelope(_)) => "envelope",
            GuardEvent::Materializer(MaterializerEvent::Decision(_)) => "decision",
            GuardEvent::Control(e) => match e {
                ControlEvent::Sync(_) => "sync",
                ControlEvent::UpdatePrepared(_) => "update_prepared",
                ControlEvent::UpdateUnguarded(_) => "update_unguarded",
                ControlEvent::UpdateApplied(_) => "update_applied",
                ControlEvent::UpdateCommitted(_) => "update_committed",
                ControlEvent::UpdateAborted(_) => "update_aborted",
            },
        }
    }

    /// The event's payload (its kind's fields) as the log stores and seals
    /// it: canonical JSON.
    pub fn canonical_payload(&self) -> String {
        to_canonical_json(&Payload(self)).expect("a guard event serializes")
    }

    /// Reads a stored event: its producer, kind and payload must be one of
    /// the typed events, field for field.
    pub fn parse(producer: &str, kind: &str, payload: &str) -> Result<GuardEvent, EventError> {
        let fail = |e: serde_json::Error| EventError::Payload { kind: kind.into(), message: e.to_string() };
        // The payload is read as the producer's adjacently tagged enum reads
        // it; it must be JSON on its own first, so nothing else can close the
        // object early.
        serde_json::from_str::<serde::de::IgnoredAny>(payload).map_err(fail)?;
        let kind_json = serde_json::to_string(kind).expect("a string serializes");
        let tagged = format!("{{\"kind\":{kind_json},\"payload\":{payload}}}");
        Ok(match producer {
            "rollout_engine" => GuardEvent::RolloutEngine(serde_json::from_str(&tagged).map_err(fail)?),
            "verifier" => GuardEvent::Verifier(serde_json::from_str(&tagged).map_err(fail)?),
            "materializer" => GuardEvent::Materializer(serde_json::from_str(&tagged).map_err(fail)?),
            "control" => GuardEvent::Control(serde_json::from_str(&tagged).map_err(fail)?),
            other => return Err(EventError::UnknownProducer(other.into())),
        })
    }

    /// The iteration the event belongs to.
    pub fn iteration(&self) -> usize {
        match self {
            GuardEvent::RolloutEngine(RolloutEngineEvent::Generation(e)) => e.iteration,
            GuardEvent::Verifier(VerifierEvent::Reward(e)) => e.iteration,
            GuardEvent::Materializer(MaterializerEvent::Envelope(e)) => e.iteration,
            GuardEvent::Materializer(MaterializerEvent::Decision(e)) => e.iteration,
            GuardEvent::Control(e) => match e {
                ControlEvent::Sync(e) => e.iteration,
                ControlEvent::UpdatePrepared(e) => e.iteration,
                ControlEvent::UpdateUnguarded(e) => e.iteration,
                ControlEvent::UpdateApplied(e) | ControlEvent::UpdateAborted(e) => e.iteration,
                ControlEvent::UpdateCommitted(e) => e.iteration,
            },
        }
    }

    /// The guard's decision, for a decision event.
    pub fn decision(&self) -> Option<&BatchDecision> {
        match self {
            GuardEvent::Materializer(MaterializerEvent::Decision(d)) => Some(d),
            _ => None,
        }
    }
}

/// A guard event's payload alone (its kind's fields, without the kind), as
/// the log holds it and `orchestrate events --json` shows it.
#[derive(Debug, Clone, Copy)]
pub struct Payload<'a>(pub &'a GuardEvent);

impl Serialize for Payload<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            GuardEvent::RolloutEngine(RolloutEngineEvent::Generation(e)) => e.serialize(s),
            GuardEvent::Verifier(VerifierEvent::Reward(e)) => e.serialize(s),
            GuardEvent::Materializer(MaterializerEvent::Envelope(e)) => e.serialize(s),
            GuardEvent::Materializer(MaterializerEvent::Decision(e)) => e.serialize(s),
            GuardEvent::Control(e) => match e {
                ControlEvent::Sync(e) => e.serialize(s),
                ControlEvent::UpdatePrepared(e) => e.serialize(s),
                ControlEvent::UpdateUnguarded(e) => e.serialize(s),
                ControlEvent::UpdateApplied(e) | ControlEvent::UpdateAborted(e) => e.serialize(s),
                ControlEvent::UpdateCommitted(e) => e.serialize(s),
            },
        }
    }
}

/// Appends a typed event to a lineage's chain. Returns the seal.
pub fn log(ledger: &mut Ledger, lineage: &str, event: &GuardEvent) -> Result<String, EventError> {
    append(ledger, lineage, event.producer(), event.kind(), &event.canonical_payload())
}

/// Appends an event (its payload canonical JSON), refusing a kind its
/// producer does not own. Returns the seal.
pub(crate) fn append(
    ledger: &mut Ledger,
    lineage: &str,
    producer: &str,
    kind: &str,
    payload: &str,
) -> Result<String, EventError> {
    let owner = PRODUCERS
        .iter()
        .find(|(_, kinds)| kinds.contains(&kind))
        .map(|(p, _)| *p)
        .ok_or_else(|| EventError::UnknownKind(kind.into()))?;
    if owner != producer {
        return Err(EventError::NotOwner { producer: producer.into(), kind: kind.into(), owner: owner.into() });
    }
    Ok(ledger.append_event(lineage, producer, kind, payload)?)
}

/// Checks a lineage's chain: contiguous order, links and seals. The first
/// problem found, precisely, or `None` when intact.
pub fn verify(ledger: &Ledger, lineage: &str) -> Result<Option<String>, StoreError> {
    Ok(verify_events(&ledger.events(lineage)?))
}

/// [`verify`] over a chain's events already read (in order), for a reader
/// that goes on to use them.
pub fn verify_events(events: &[super::ledger::StoredEvent]) -> Option<String> {
    let mut prev = "genesis";
    for (i, event) in events.iter().enumerate() {
        let super::ledger::StoredEvent { seq, producer, kind, payload, prev: stored_prev, seal: stored_seal } = event;
        let (seq, expected_seq) = (*seq, i as i64 + 1);
        if seq != expected_seq {
            return Some(format!("event {expected_seq} is missing or out of order (found {seq})"));
        }
        if stored_prev != prev {
            return Some(format!("event {seq} does not follow event {}: events were removed or reordered", seq - 1));
        }
        if seal(prev, seq, producer, kind, payload) != *stored_seal {
            return Some(format!("event {seq} ({kind}) was edited: its seal does not match its content"));
        }
        prev = stored_seal;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::canonical_json;
    use serde_json::{json, Value};

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
            append(&mut index, "L", producer, kind, &format!(r#"{{"v":{v}}}"#)).unwrap();
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

    /// (Issue #35.) Each typed event stores the payload the untyped `json!`
    /// events stored, byte for byte in canonical JSON (so the seals of chains
    /// logged before still verify), reads back as itself, and a payload with a
    /// field its kind does not have, or under another producer, does not read.
    #[test]
    fn typed_events_store_the_payloads_logged_before_and_read_back_strictly() {
        let allowed = BatchDecision { iteration: 2, decision: Decision::Allow, batch: Some("b".into()), codes: None };
        let refused = BatchDecision {
            iteration: 2,
            decision: Decision::Reject,
            batch: None,
            codes: Some(vec!["T001_ARTIFACT_HASH_MISMATCH".into()]),
        };
        let cases: Vec<(GuardEvent, &str, Value)> = vec![
            (
                GuardEvent::Control(ControlEvent::Sync(PolicySync { iteration: 1, trainer_version: 3 })),
                "sync",
                json!({"iteration": 1, "trainer_version": 3}),
            ),
            (
                GuardEvent::RolloutEngine(RolloutEngineEvent::Generation(Generation {
                    iteration: 1,
                    rollouts: [8, 16],
                    policy_version: 3,
                    policy_digest: "d".into(),
                    artifacts: vec!["a1".into(), "a2".into()],
                })),
                "generation",
                json!({"iteration": 1, "rollouts": [8, 16], "policy_version": 3, "policy_digest": "d", "artifacts": ["a1", "a2"]}),
            ),
            (
                GuardEvent::Verifier(VerifierEvent::Reward(Reward {
                    iteration: 1,
                    verifier: "v".into(),
                    protocol_hash: "h".into(),
                    rewards: vec![1.0, 0.0, 0.5],
                })),
                "reward",
                json!({"iteration": 1, "verifier": "v", "protocol_hash": "h", "rewards": [1.0, 0.0, 0.5]}),
            ),
            (
                GuardEvent::Materializer(MaterializerEvent::Envelope(EnvelopeDigests {
                    iteration: 1,
                    envelopes: vec!["e".into()],
                })),
                "envelope",
                json!({"iteration": 1, "envelopes": ["e"]}),
            ),
            (
                GuardEvent::Materializer(MaterializerEvent::Decision(allowed)),
                "decision",
                json!({"iteration": 2, "decision": "allow", "batch": "b"}),
            ),
            (
                GuardEvent::Materializer(MaterializerEvent::Decision(refused)),
                "decision",
                json!({"iteration": 2, "decision": Decision::Reject, "codes": ["T001_ARTIFACT_HASH_MISMATCH"]}),
            ),
            (
                GuardEvent::Control(ControlEvent::UpdatePrepared(Prepared {
                    iteration: 2,
                    update: 4,
                    nonce: "n".into(),
                })),
                "update_prepared",
                json!({"iteration": 2, "update": 4, "nonce": "n"}),
            ),
            (
                GuardEvent::Control(ControlEvent::UpdateUnguarded(Unguarded {
                    iteration: 2,
                    update: 4,
                    guard: GuardOff::Off,
                })),
                "update_unguarded",
                json!({"iteration": 2, "update": 4, "guard": "off"}),
            ),
            (
                GuardEvent::Control(ControlEvent::UpdateApplied(UpdateRef { iteration: 2, update: 4 })),
                "update_applied",
                json!({"iteration": 2, "update": 4}),
            ),
            (
                GuardEvent::Control(ControlEvent::UpdateCommitted(Committed {
                    iteration: 2,
                    update: Some(4),
                    checkpoint: None,
                })),
                "update_committed",
                json!({"iteration": 2, "update": 4}),
            ),
            (
                GuardEvent::Control(ControlEvent::UpdateCommitted(Committed {
                    iteration: 2,
                    update: None,
                    checkpoint: Some(3),
                })),
                "update_committed",
                json!({"iteration": 2, "checkpoint": 3}),
            ),
            (
                GuardEvent::Control(ControlEvent::UpdateAborted(UpdateRef { iteration: 2, update: 4 })),
                "update_aborted",
                json!({"iteration": 2, "update": 4}),
            ),
        ];
        let (_d, mut ledger) = log();
        for (event, kind, before) in &cases {
            assert_eq!(event.kind(), *kind);
            assert_eq!(event.canonical_payload(), canonical_json(before), "{kind}");
            log_event(&mut ledger, event);
            let stored = ledger.events("L").unwrap().pop().unwrap();
            assert_eq!((stored.producer.as_str(), stored.kind.as_str()), (event.producer(), *kind));
            assert_eq!(&GuardEvent::parse(&stored.producer, &stored.kind, &stored.payload).unwrap(), event);
        }
        assert_eq!(verify(&ledger, "L").unwrap(), None);
        let extra = GuardEvent::parse("control", "update_applied", r#"{"iteration": 2, "update": 4, "x": 1}"#);
        assert!(extra.unwrap_err().to_string().contains("unknown field `x`"));
        assert!(GuardEvent::parse("verifier", "update_applied", r#"{"iteration": 2, "update": 4}"#).is_err());
    }

    fn log_event(ledger: &mut Ledger, event: &GuardEvent) {
        super::log(ledger, "L", event).unwrap();
    }

    #[test]
    fn only_a_kinds_producer_may_write_it() {
        let (_d, mut index) = log();
        let err = append(&mut index, "L", "control", "generation", "{}").unwrap_err().to_string();
        assert_eq!(err, "producer 'control' may not write 'generation' events (only rollout_engine may)");
        assert!(append(&mut index, "L", "control", "mystery", "{}").is_err());
    }
}
