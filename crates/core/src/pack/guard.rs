//! A pack's guard logs. Each GRPO lineage's sealed event chain is frozen from
//! the workspace's ledger into `guard/<lineage>.jsonl` (one stored event a
//! line, seals and all), so that an auditor holding only the pack checks that
//! the chain is intact and typed, and that every generation it seals is the
//! tokens the pack's `rollouts` hold: the guard's decisions, the updates it
//! allowed and the rollouts they were made from, without trusting the
//! workspace they came from.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::manifest::{Manifest, PackedChain, PackedNode};
use super::{inside, io, read_bounded, PackError};
use crate::guard::events::{verify_events, GuardEvent, RolloutEngineEvent};
use crate::guard::ledger::StoredEvent;
use crate::guard::{rollouts, Ledger};
use crate::ids::short;
use crate::ops::artifacts::ArtifactKind;
use crate::store::Workspace;
use crate::train::metrics::TrainingMetrics;

/// The folder of a pack's guard logs.
pub const DIR: &str = "guard";

/// Writes the guard log of every GRPO lineage among `nodes` into `tmp` and
/// returns what the manifest says of each. A GRPO node whose lineage has no
/// verified chain in this workspace (a node taken from a remote cache brings
/// none) is refused: a pack never claims a guard it cannot show.
pub(super) fn freeze(ws: &Workspace, nodes: &[PackedNode], tmp: &Path) -> Result<Vec<PackedChain>, PackError> {
    let mut lineages: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for node in nodes {
        if ArtifactKind::Rollouts.output_of(&node.op).is_none() {
            continue;
        }
        let name = ArtifactKind::TrainingMetrics.output_of(&node.op).unwrap_or("metrics");
        let metrics = node
            .outputs
            .iter()
            .find(|o| o.name == name)
            .ok_or_else(|| PackError::Refused(format!("GRPO node '{}' has no {name} output", node.id)))?;
        let read = TrainingMetrics::read(&ws.object_path(&metrics.blake3))
            .map_err(|e| PackError::Refused(format!("node '{}': {e}", node.id)))?;
        let TrainingMetrics::Grpo(m) = read else {
            return Err(PackError::Refused(format!("node '{}': its metrics are not GRPO metrics", node.id)));
        };
        lineages.entry(m.lineage).or_default().push(node.id.clone());
    }
    if lineages.is_empty() {
        return Ok(Vec::new());
    }
    let ledger = Ledger::open_read_only(ws)?;
    let mut chains = Vec::new();
    for (lineage, ids) in lineages {
        let events = match &ledger {
            Some(l) => l.events(&lineage)?,
            None => Vec::new(),
        };
        let refuse = |why: String| {
            PackError::Refused(format!(
                "GRPO node '{}': {why}; run `orchestrate run SPEC --force {}` to make it here, then freeze",
                ids.join("', '"),
                ids[0]
            ))
        };
        if events.is_empty() {
            return Err(refuse(format!(
                "its guard log (lineage {}) is not in this workspace's ledger (a node taken from a remote cache brings none)",
                short(&lineage)
            )));
        }
        if let Some(problem) = verify_events(&events) {
            return Err(refuse(format!("its guard log (lineage {}) does not verify: {problem}", short(&lineage))));
        }
        let file = format!("{DIR}/{lineage}.jsonl");
        let mut text = String::new();
        for e in &events {
            text.push_str(&serde_json::to_string(e).map_err(|e| PackError::Refused(e.to_string()))?);
            text.push('\n');
        }
        let path = tmp.join(&file);
        std::fs::create_dir_all(tmp.join(DIR)).map_err(io(format!("creating {}", tmp.join(DIR).display())))?;
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))?;
        let last_seal = events.last().map(|e| e.seal.clone()).unwrap_or_default();
        chains.push(PackedChain { lineage, nodes: ids, file, events: events.len(), last_seal });
    }
    Ok(chains)
}

/// Every problem of the pack's guard logs: a file that does not read, a
/// chain that does not verify or is not the one the manifest recorded, an
/// event that is not a typed guard event, and a generation whose tokens the
/// packed rollouts of its lineage do not hold. A lineage whose rollouts were
/// listed by hash only (over `--max-output-bytes`) has its chain checked, not
/// its generations.
pub(super) fn verify(dir: &Path, manifest: &Manifest, problems: &mut Vec<String>) {
    for chain in &manifest.guard {
        let what = format!("the guard log of lineage {} ({})", short(&chain.lineage), chain.nodes.join(", "));
        if chain.file != format!("{DIR}/{}.jsonl", chain.lineage) {
            problems.push(format!("{what}: MANIFEST.json names it {}, not {DIR}/LINEAGE.jsonl", chain.file));
            continue;
        }
        let text = match inside(dir, &chain.file).map_err(|e| e.to_string()).and_then(|p| read_bounded(&p)) {
            Ok(text) => text,
            Err(e) => {
                problems.push(format!("{what}: {}: {e}", chain.file));
                continue;
            }
        };
        let mut events = Vec::new();
        for (i, line) in text.lines().enumerate() {
            match serde_json::from_str::<StoredEvent>(line) {
                Ok(e) => events.push(e),
                Err(e) => {
                    problems.push(format!("{what}: {} line {} is not a stored guard event: {e}", chain.file, i + 1));
                    break;
                }
            }
        }
        if let Some(problem) = verify_events(&events) {
            problems.push(format!("{what} does not verify: {problem}"));
            continue;
        }
        let last = events.last().map(|e| e.seal.as_str()).unwrap_or_default();
        if events.len() != chain.events || last != chain.last_seal {
            problems.push(format!(
                "{what} holds {} events ending in seal {}, the manifest recorded {} ending in {}: events were removed or appended",
                events.len(),
                short(last),
                chain.events,
                short(&chain.last_seal)
            ));
            continue;
        }
        let mut generated = Vec::new();
        for e in &events {
            match GuardEvent::parse(&e.producer, &e.kind, &e.payload) {
                Ok(GuardEvent::RolloutEngine(RolloutEngineEvent::Generation(g))) => {
                    generated.push((g.iteration, g.artifacts))
                }
                Ok(_) => {}
                Err(err) => problems.push(format!("{what}: event {}: {err}", e.seq)),
            }
        }
        let Some(holders) = rollout_folders(dir, manifest, &chain.nodes) else { continue };
        let find = |iteration: usize| {
            let name = rollouts::file_name(iteration);
            holders.iter().find(|d| d.join(&name).is_file()).cloned()
        };
        if let Err(e) = rollouts::check_generated(&generated, find) {
            problems.push(format!("{what} names rollouts the pack does not hold: {e}"));
        }
    }
}

/// The packed `rollouts` folders of `nodes`; `None` when one of them was
/// listed by hash only (its generations cannot be checked from the pack).
fn rollout_folders(dir: &Path, manifest: &Manifest, nodes: &[String]) -> Option<Vec<PathBuf>> {
    let mut out = Vec::new();
    for id in nodes {
        let node = manifest.nodes.iter().find(|n| &n.id == id)?;
        let name = ArtifactKind::Rollouts.output_of(&node.op)?;
        let output = node.outputs.iter().find(|o| o.name == name)?;
        out.push(inside(dir, output.path.as_deref()?).ok()?);
    }
    Some(out)
}
