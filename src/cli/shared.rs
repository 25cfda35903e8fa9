//! What several commands share: loading a spec with the command line's
//! overrides, cutting it to targets, and naming nodes.

use std::collections::BTreeSet;

use anyhow::{bail, Result};

use super::*;
use orchestrate_core::dag::{self, Dag};
use orchestrate_core::exec::plan::{self};
use orchestrate_core::exec::{self};
use orchestrate_core::ops::Registry;
use orchestrate_core::runtime;
use orchestrate_core::spec::{self, did_you_mean, LoadOptions, Override, Spec};
use orchestrate_core::store::Workspace;

/// Leaves a loaded spec and DAG to the process's exit instead of freeing
/// them node by node: a command that loaded them exits right after (freeing
/// a 10,000-node spec and DAG was about 4 % of its `plan`, `perf record`).
pub(super) fn free_at_exit(spec: Spec, dag: Dag) {
    std::mem::forget((spec, dag));
}

pub(super) fn load(args: &SpecArgs, registry: &Registry) -> Result<(Spec, Dag)> {
    load_with(args, registry, None)
}

/// As [`load`], reading spec files parsed before from the workspace's parse
/// cache (what it parses afresh is kept there by `parsed.save()`, once the
/// workspace is open).
pub(super) fn load_with(
    args: &SpecArgs,
    registry: &Registry,
    parsed: Option<std::sync::Arc<spec::parsed::ParseCache>>,
) -> Result<(Spec, Dag)> {
    let overrides = args.set.iter().map(|s| Override::parse(s)).collect::<Result<Vec<_>, _>>()?;
    let x = &args.executor;
    let resources = spec::SlurmResources {
        partition: x.partition.clone(),
        account: x.account.clone(),
        time: x.time.clone(),
        gpus: x.gpus,
        cpus: x.cpus,
        mem: x.mem.clone(),
        sbatch: x.sbatch.clone(),
        setup: Vec::new(),
        retries: x.retries,
    };
    let opts = LoadOptions {
        profile: args.profile.clone(),
        overrides,
        executor: x.executor.map(Into::into),
        resources: Some(resources),
        parsed: parsed.clone(),
    };
    let spec = spec::load(&args.spec, &opts)?;
    let dag = dag::compile_with(&spec, registry, parsed.as_deref())?;
    if spec.executor == spec::ExecutorKind::Slurm {
        exec::slurm::check_resources(&dag).map_err(|e| anyhow::anyhow!("{}: {e}", args.spec.display()))?;
    }
    Ok((spec, dag))
}

/// The targets of `run`/`plan NODE...` and what they need: the spec and DAG cut
/// down to them (keys never depend on other nodes, so each key is the one the
/// whole spec gives), and the forced node ids, which must lie inside the cut.
pub(super) fn select(
    mut spec: Spec,
    dag: Dag,
    targets: Vec<String>,
    force: Vec<String>,
) -> Result<(Spec, Dag, BTreeSet<String>)> {
    let forced = expand_nodes(&dag, force)?;
    if targets.is_empty() {
        return Ok((spec, dag, forced));
    }
    let named = expand_nodes(&dag, targets)?;
    let dag = dag.restrict(&named);
    if let Some(outside) = forced.iter().find(|id| dag.position(id).is_none()) {
        bail!(
            "--force {outside}: not one of the targets ({}) or a node they need",
            named.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    spec.nodes.retain(|n| dag.position(&n.id).is_some());
    Ok((spec, dag, forced))
}

/// `force` plus every cached node whose dropped state (`gc --drop-states`)
/// a node that will run reads, each said on stderr.
pub(super) fn regenerate_dropped(
    ws: Option<&Workspace>,
    spec: &Spec,
    dag: &Dag,
    mut force: BTreeSet<String>,
) -> Result<BTreeSet<String>> {
    // An index that cannot be read is left to the command's own use of it,
    // which says what is wrong and how to recover, once.
    let Ok(needed) = plan::dropped_needed(ws, spec, dag, &force, &runtime::env_provider()) else {
        return Ok(force);
    };
    for r in needed {
        eprintln!(
            "note: {} runs again: its '{}' was dropped by gc --drop-states and {} needs it",
            r.node, r.output, r.reader
        );
        force.insert(r.node);
    }
    Ok(force)
}

pub(super) fn check_nodes(dag: &Dag, ids: Vec<String>) -> Result<BTreeSet<String>> {
    for id in &ids {
        if dag.get(id).is_none() {
            return Err(no_such_node(dag, id));
        }
    }
    Ok(ids.into_iter().collect())
}

pub(super) fn no_such_node(dag: &Dag, id: &str) -> anyhow::Error {
    let ids = dag.ids();
    anyhow::anyhow!("no node '{id}' in this spec{}; nodes: {}", did_you_mean(id, ids.iter().copied()), ids.join(", "))
}

/// The node ids named by `--force`. A node's written id (`grpo`) names
/// every expansion of its matrix (`grpo@seed=0`, `grpo@seed=1`), as `events
/// --node` does and as DVC's `repro` does for a `foreach` stage.
pub(super) fn expand_nodes(dag: &Dag, ids: Vec<String>) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for id in &ids {
        if dag.get(id).is_some() {
            out.insert(id.clone());
            continue;
        }
        let expansions: Vec<&str> =
            dag.nodes.iter().filter(|n| n.def.base_id == *id).map(|n| n.def.id.as_str()).collect();
        if expansions.is_empty() {
            return Err(no_such_node(dag, id));
        }
        out.extend(expansions.into_iter().map(str::to_string));
    }
    Ok(out)
}
