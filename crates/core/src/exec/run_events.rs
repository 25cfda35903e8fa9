//! A run's events as one typed stream: the engine's events in order, then each
//! GRPO node's sealed guard events, each chain verified first. What `orchestrate events`, `alert-scan`
//! and their JSON output read, one shared type instead of JSON looked up by
//! field name.

use serde::{Serialize, Serializer};

use super::events::Event;
use crate::guard::codes::Decision;
use crate::guard::events::{GuardEvent, RolloutEngineEvent};
use crate::ops::artifacts::ArtifactKind;
use crate::ops::worker::WorkerOp;
use crate::store::{OutputKind, Workspace};
use crate::train::metrics::TrainingMetrics;

/// One event of a run, from the engine or from a GRPO node's guard log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunEvent {
    pub source: Source,
    pub run: String,
    /// Its position: in the run's engine events, or in its guard lineage.
    pub seq: i64,
    /// The event's name (`node_finished`, `decision`, `update_applied`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The node it is about, if any.
    pub node: Option<String>,
    /// Reason codes (a refused batch's).
    pub codes: Vec<String>,
    #[serde(flatten)]
    pub detail: Detail,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Engine,
    Guard,
}

/// What only one source has.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Detail {
    Engine {
        event: Event,
    },
    Guard {
        producer: String,
        lineage: String,
        seal: String,
        /// A decision event's decision; `null` for other kinds.
        decision: Option<Decision>,
        iteration: usize,
        /// The event, typed; shown as its fields as sealed (`payload`).
        #[serde(rename = "payload", serialize_with = "payload_only")]
        event: GuardEvent,
    },
}

fn payload_only<S: Serializer>(event: &GuardEvent, s: S) -> Result<S::Ok, S::Error> {
    crate::guard::events::Payload(event).serialize(s)
}

#[derive(Debug, thiserror::Error)]
pub enum RunEventsError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("event {seq} of run {run} is not an engine event: {message}")]
    Engine { run: String, seq: usize, message: String },
    #[error("node {node}: {message}")]
    Node { node: String, message: String },
    #[error(
        "node {node}: the guard log of lineage {lineage} does not verify: {problem}; none of its events is shown as sealed"
    )]
    Chain { node: String, lineage: String, problem: String },
    #[error("node {node}: the guard log of lineage {lineage} names rollouts that are not held: {problem}")]
    Rollouts { node: String, lineage: String, problem: String },
    #[error("node {node}: guard event {seq} of lineage {lineage}: {source}")]
    Guard {
        node: String,
        seq: i64,
        lineage: String,
        #[source]
        source: Box<crate::guard::events::EventError>,
    },
}

/// Every event of a run, engine events first (in order), then, for each node
/// of the run that has GRPO metrics, its guard event chain.
pub fn collect(ws: &Workspace, run: &str) -> Result<Vec<RunEvent>, RunEventsError> {
    let index = ws.index()?;
    let mut out = Vec::new();
    for (seq, text) in index.run_events(run)?.iter().enumerate() {
        let e: Event = serde_json::from_str(text).map_err(|e| RunEventsError::Engine {
            run: run.to_string(),
            seq,
            message: e.to_string(),
        })?;
        out.push(RunEvent {
            source: Source::Engine,
            run: run.to_string(),
            seq: seq as i64,
            kind: e.kind().to_string(),
            node: e.node().map(str::to_string),
            codes: Vec::new(),
            detail: Detail::Engine { event: e },
        });
    }
    let Some(ledger) = crate::guard::Ledger::open_read_only(ws)? else { return Ok(out) };
    // Each GRPO node of the run: its lineage (from its training metrics) and
    // the folder of its rollouts output.
    let mut grpo = Vec::new();
    for n in index.run_nodes(run)? {
        let Some(key) = &n.key else { continue };
        let Some(cached) = index.lookup(key)? else { continue };
        let node_error = |message: String| RunEventsError::Node { node: n.node_id.clone(), message };
        // GRPO nodes have a guard lineage; their training metrics say which.
        let op = cached.record.op.clone();
        if op != WorkerOp::TrainGrpo.name() {
            continue;
        }
        // The outputs it had in this run, not what a later run stored under its key.
        let had = n.outputs_had(Some(&cached));
        let output = |kind: ArtifactKind| {
            let name = kind.output_of(&op)?;
            had.iter().find(|o| o.name == name).map(|o| ws.object_path(&o.object.hash))
        };
        let metrics = output(ArtifactKind::TrainingMetrics)
            .ok_or_else(|| node_error("a GRPO node without its metrics output".to_string()))?;
        let read = TrainingMetrics::read(&metrics).map_err(|e| node_error(e.to_string()))?;
        let TrainingMetrics::Grpo(m) = read else {
            return Err(node_error("its metrics are not GRPO metrics".into()));
        };
        grpo.push(GrpoNode { id: n.node_id.clone(), lineage: m.lineage, rollouts: output(ArtifactKind::Rollouts) });
    }
    // An interrupt and its resume share a lineage: its rollouts are checked once.
    let mut checked = std::collections::BTreeSet::new();
    for node in &grpo {
        // Only a chain that verifies is read: an edited, removed or reordered
        // event would otherwise be reported as what the run sealed.
        let chain = ledger.events(&node.lineage)?;
        if let Some(problem) = crate::guard::events::verify_events(&chain) {
            return Err(RunEventsError::Chain { node: node.id.clone(), lineage: node.lineage.clone(), problem });
        }
        let mut generated = Vec::new();
        for stored in chain {
            let event = GuardEvent::parse(&stored.producer, &stored.kind, &stored.payload).map_err(|source| {
                RunEventsError::Guard {
                    node: node.id.clone(),
                    seq: stored.seq,
                    lineage: node.lineage.clone(),
                    source: Box::new(source),
                }
            })?;
            if let GuardEvent::RolloutEngine(RolloutEngineEvent::Generation(g)) = &event {
                generated.push((g.iteration, g.artifacts.clone()));
            }
            let codes = event.decision().and_then(|d| d.codes.clone()).unwrap_or_default();
            let decision = event.decision().map(|d| d.decision);
            let iteration = event.iteration();
            out.push(RunEvent {
                source: Source::Guard,
                run: run.to_string(),
                seq: stored.seq,
                kind: stored.kind,
                node: Some(node.id.clone()),
                codes,
                detail: Detail::Guard {
                    producer: stored.producer,
                    lineage: node.lineage.clone(),
                    seal: stored.seal,
                    decision,
                    iteration,
                    event,
                },
            });
        }
        if checked.insert(node.lineage.as_str()) {
            check_rollouts(ws, node, &grpo, &generated)?;
        }
    }
    Ok(out)
}

/// A GRPO node of a run, as its guard log is checked.
struct GrpoNode {
    id: String,
    lineage: String,
    /// Its rollouts folder; `None` for a node from before they were an output.
    rollouts: Option<std::path::PathBuf>,
}

/// The tokens a guard log says were generated are held, byte for byte: each
/// generation event's artifacts are the rollouts file of its iteration in the
/// output of a node of that lineage (an interrupt and its resume share one).
/// A node from before the rollouts were an output (`train.grpo` version 8
/// and older) published each rollout as an object of its own: those objects
/// must be in the store and hash to their names.
fn check_rollouts(
    ws: &Workspace,
    node: &GrpoNode,
    grpo: &[GrpoNode],
    generated: &[(usize, Vec<String>)],
) -> Result<(), RunEventsError> {
    let missing =
        |e: String| RunEventsError::Rollouts { node: node.id.clone(), lineage: node.lineage.clone(), problem: e };
    let holders: Vec<&std::path::Path> =
        grpo.iter().filter(|g| g.lineage == node.lineage).filter_map(|g| g.rollouts.as_deref()).collect();
    if holders.is_empty() {
        for (iteration, hashes) in generated {
            for h in hashes {
                let problem = match crate::store::objects::intact(&ws.object_path(h), h, OutputKind::File) {
                    Ok(Some(true)) => continue,
                    Ok(Some(false)) => "its bytes no longer hash to its name".to_string(),
                    Ok(None) => "missing from the store".to_string(),
                    Err(e) => e.to_string(),
                };
                return Err(missing(format!("iteration {iteration}: rollout object {h}: {problem}")));
            }
        }
        return Ok(());
    }
    let find = |iteration: usize| {
        let name = crate::guard::rollouts::file_name(iteration);
        holders.iter().find(|dir| dir.join(&name).is_file()).map(|dir| dir.to_path_buf())
    };
    crate::guard::rollouts::check_generated(generated, find).map_err(|e| missing(e.to_string()))
}

impl RunEvent {
    /// A guard decision that was not ALLOW: what `alert-scan` posts.
    pub fn alert(&self) -> Option<Alert> {
        let Detail::Guard { lineage, seal, decision: Some(decision), iteration, .. } = &self.detail else {
            return None;
        };
        (*decision != Decision::Allow).then(|| Alert {
            run: self.run.clone(),
            node: self.node.clone().unwrap_or_default(),
            iteration: *iteration,
            decision: *decision,
            codes: self.codes.clone(),
            lineage: lineage.clone(),
            seq: self.seq,
            seal: seal.clone(),
        })
    }
}

/// A non-ALLOW guard decision, as posted to a webhook.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alert {
    pub run: String,
    pub node: String,
    pub iteration: usize,
    pub decision: Decision,
    pub codes: Vec<String>,
    pub lineage: String,
    pub seq: i64,
    pub seal: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::TokenArtifacts;

    fn rollout(t: i64) -> TokenArtifacts {
        TokenArtifacts {
            prompt_ids: vec![1, t],
            response_ids: vec![t],
            old_logprobs: vec![-0.5],
            mask_start: 2,
            mask_len: 1,
        }
    }

    /// A node from before the rollouts were an output published each rollout
    /// as an object of its own: its guard log is checked against those, and
    /// one the store no longer holds (what gc removed then) is an error.
    #[test]
    fn a_node_from_before_rollouts_were_an_output_is_checked_against_its_objects() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(&dir.path().join("ws")).unwrap();
        let staged = dir.path().join("artifact");
        std::fs::write(&staged, rollout(3).canonical_bytes()).unwrap();
        let held = ws.publish_move(&staged, crate::ops::OutputKind::File).unwrap();
        assert_eq!(held.hash, rollout(3).hash());
        let node = GrpoNode { id: "grpo".into(), lineage: "L".into(), rollouts: None };
        let grpo = [GrpoNode { id: "grpo".into(), lineage: "L".into(), rollouts: None }];
        check_rollouts(&ws, &node, &grpo, &[(0, vec![rollout(3).hash()])]).unwrap();
        let e = check_rollouts(&ws, &node, &grpo, &[(0, vec![rollout(3).hash(), rollout(4).hash()])])
            .unwrap_err()
            .to_string();
        assert!(e.contains("node grpo") && e.contains("iteration 0") && e.contains("missing from the store"), "{e}");
    }

    /// `events --json` shows a guard event's payload as the ledger sealed it:
    /// the kind's fields, keyed as stored, beside the event's own columns.
    #[test]
    fn a_guard_events_json_shows_the_payload_it_sealed() {
        use crate::guard::events::{BatchDecision, MaterializerEvent};
        let event = GuardEvent::Materializer(MaterializerEvent::Decision(BatchDecision {
            iteration: 3,
            decision: Decision::Reject,
            batch: None,
            codes: Some(vec!["T001_ARTIFACT_HASH_MISMATCH".into()]),
        }));
        let sealed = event.canonical_payload();
        let shown = RunEvent {
            source: Source::Guard,
            run: "r".into(),
            seq: 5,
            kind: event.kind().into(),
            node: Some("grpo".into()),
            codes: vec!["T001_ARTIFACT_HASH_MISMATCH".into()],
            detail: Detail::Guard {
                producer: event.producer().into(),
                lineage: "L".into(),
                seal: "s".into(),
                decision: Some(Decision::Reject),
                iteration: 3,
                event: event.clone(),
            },
        };
        let json: serde_json::Value = serde_json::to_value(&shown).unwrap();
        let payload: serde_json::Value = serde_json::from_str(&sealed).unwrap();
        assert_eq!(json["payload"], payload);
        assert_eq!(json["payload"]["codes"][0], "T001_ARTIFACT_HASH_MISMATCH");
        assert_eq!((json["type"].as_str(), json["producer"].as_str()), (Some("decision"), Some("materializer")));
        assert!(json.get("event").is_none(), "the typed event is shown as its payload only: {json}");
    }
}
