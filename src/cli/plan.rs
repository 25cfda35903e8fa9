//! `orchestrate plan`, `explain` and `path`: what the cache holds for a spec, changing nothing.

use std::collections::BTreeSet;

use anyhow::{bail, Result};

use super::commands::Ctx;
use super::exit::Status;
use super::keys::open_remote;
use super::shared::*;
use super::*;
use orchestrate_core::dag::{self};
use orchestrate_core::exec::plan::{self, PlanEntry, PlanState};
use orchestrate_core::runtime;
use orchestrate_core::spec::did_you_mean;
use orchestrate_core::spec::parsed::ParseCache;
use orchestrate_core::store::Workspace;

/// `orchestrate plan`: each node cached, or will run and why.
pub fn plan(ctx: &Ctx, args: PlanArgs) -> Result<Status> {
    let PlanArgs { spec, targets, force, json, remote } = args;
    // Read from the parse cache, never written: `plan` changes nothing.
    let parsed = std::sync::Arc::new(ParseCache::new(&ctx.workspace));
    let (spec, dag) = load_with(&spec, &ctx.registry, Some(parsed))?;
    let (spec, dag, force) = select(spec, dag, targets, force)?;
    let remote = remote
        .remote
        .as_deref()
        .map(|url| open_remote(&ctx.workspace, Some(url), None, &remote.trust, false))
        .transpose()?;
    let ws = Workspace::open_read_only(&ctx.workspace)?;
    let force = regenerate_dropped(ws.as_ref(), &spec, &dag, force)?;
    let entries = plan::plan_with_remote(ws.as_ref(), &spec, &dag, &force, &runtime::env_provider(), remote.as_ref())?;
    print_plan(&entries, json);
    free_at_exit(spec, dag);
    let broken = entries.iter().any(|e| matches!(e.state, PlanState::Error { .. }));
    Ok(if broken { Status::Failed } else { Status::Ok })
}

/// `orchestrate explain`: the hash-input diff of a node between its record and now.
pub fn explain(ctx: &Ctx, args: ExplainArgs) -> Result<Status> {
    let ExplainArgs { spec, node, json } = args;
    let (spec, dag) = load(&spec, &ctx.registry)?;
    // A matrix node's written id explains each of its expansions.
    let ids = expand_nodes(&dag, vec![node.clone()])?;
    let ws = Workspace::open_read_only(&ctx.workspace)?;
    let mut all = Vec::new();
    for id in &ids {
        all.push(plan::explain(ws.as_ref(), &spec, &dag, id, &runtime::env_provider())?);
    }
    if json {
        if dag.get(&node).is_some() {
            outln!("{}", serde_json::to_string_pretty(&all[0])?);
        } else {
            outln!("{}", serde_json::to_string_pretty(&all)?);
        }
        return Ok(Status::Ok);
    }
    for (i, e) in all.iter().enumerate() {
        if i > 0 {
            outln!();
        }
        print_explanation(e);
    }
    Ok(Status::Ok)
}

/// `orchestrate path`: the store path of a cached output.
pub fn path(ctx: &Ctx, args: PathArgs) -> Result<Status> {
    let PathArgs { spec, output } = args;
    let (spec, dag) = load(&spec, &ctx.registry)?;
    let Some((node, name)) = output.split_once(':') else { bail!("'{output}': expected NODE:OUTPUT") };
    check_nodes(&dag, vec![node.to_string()])?;
    let outputs: Vec<String> =
        dag.get(node).map(|n| n.outputs.iter().map(|o| o.name.clone()).collect()).unwrap_or_default();
    if !outputs.iter().any(|o| o == name) {
        bail!(
            "node '{node}' has no output '{name}'{}; its outputs: {}",
            did_you_mean(name, outputs.iter().map(String::as_str)),
            outputs.join(", ")
        );
    }
    let ws = Workspace::open_read_only(&ctx.workspace)?;
    let entries = plan::plan(ws.as_ref(), &spec, &dag, &BTreeSet::new(), &runtime::env_provider())?;
    // A restorable node's objects are in the store (only its outs in the tree differ).
    let state = entries.iter().find(|e| e.node == node).map(|e| &e.state);
    let (cached, why) = match state {
        Some(PlanState::Cached { key } | PlanState::Restore { key, .. }) => (Some(key.clone()), String::new()),
        Some(PlanState::Run { reason, .. }) => (None, format!(" (it would run: {reason})")),
        Some(PlanState::CachedRemote { remote, .. }) => (None, format!(" here (the remote {remote} has it: pull it)")),
        Some(PlanState::Pending { after }) => (None, format!(" (it waits on {}, which would run)", after.join(", "))),
        Some(PlanState::Error { error }) => bail!("cannot tell whether '{node}' is cached: {error}"),
        None => (None, String::new()),
    };
    let (Some(ws), Some(key)) = (ws, cached) else {
        eprintln!("'{node}' is not cached as the spec stands{why}: run it first");
        return Ok(Status::Failed);
    };
    let record = ws.index()?.lookup(&key)?.ok_or_else(|| anyhow::anyhow!("cache row vanished for {key}"))?;
    let out =
        record.outputs.iter().find(|o| o.name == name).ok_or_else(|| anyhow::anyhow!("no output '{name}' recorded"))?;
    if let Some(why) = &out.dropped {
        eprintln!("output '{name}' of '{node}' was {why}: `orchestrate run SPEC --force {node}` makes it again");
        return Ok(Status::Failed);
    }
    let path = ws.object_path(&out.object.hash);
    outln!("{}", std::path::absolute(&path).unwrap_or(path).display());
    Ok(Status::Ok)
}

pub(super) fn print_plan(entries: &[PlanEntry], json: bool) {
    // One buffered writer for the whole plan: a line per node written one
    // write(2) each was 10,000 system calls for a 10,000-node spec.
    use std::io::Write as _;
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
    if json {
        for e in entries {
            let _ = writeln!(w, "{}", serde_json::to_string(e).expect("plan entries serialize"));
        }
        return;
    }
    let width = entries.iter().map(|e| e.node.len()).max().unwrap_or(4);
    let (mut cached, mut run, mut pending) = (0, 0, 0);
    for e in entries {
        let short = |k: &Option<orchestrate_core::store::Key>| {
            k.as_deref().map(|k| k[..8].to_string()).unwrap_or_else(|| "--------".into())
        };
        match &e.state {
            PlanState::Cached { key } => {
                cached += 1;
                let _ = writeln!(w, "{:<width$}  cached   {}", e.node, &key[..8]);
            }
            PlanState::Restore { key, reason } => {
                cached += 1;
                let _ = writeln!(
                    w,
                    "{:<width$}  restore  {}  {reason}; checked out of the store, not run",
                    e.node,
                    &key[..8]
                );
            }
            PlanState::CachedRemote { key, remote } => {
                cached += 1;
                let _ = writeln!(w, "{:<width$}  cached (remote) {}  from {remote}", e.node, &key[..8]);
            }
            PlanState::Run { key, reason } => {
                run += 1;
                let _ = writeln!(w, "{:<width$}  run      {}  {reason}", e.node, short(key));
            }
            PlanState::Pending { after } => {
                pending += 1;
                let _ = writeln!(
                    w,
                    "{:<width$}  pending  --------  runs only if {} produce{} different outputs",
                    e.node,
                    after.join(", "),
                    if after.len() == 1 { "s" } else { "" }
                );
            }
            PlanState::Error { error } => {
                let _ = writeln!(w, "{:<width$}  error    --------  {error}", e.node);
            }
        }
    }
    let _ = writeln!(w, "{cached} cached, {run} to run, {pending} pending on upstream");
}

/// One node id named on the command line, exactly.
/// `explain`'s lines for one node.
fn print_explanation(e: &plan::Explanation) {
    outln!("node     {}", e.node);
    outln!("key now  {}", e.key.as_deref().unwrap_or("(unknown)"));
    outln!("cached   {}", e.cached_key.as_deref().unwrap_or("(never completed)"));
    if let Some(at) = &e.cached_at {
        outln!("         at {at}");
    }
    if e.cached_key.is_some() && e.key.is_some() {
        if e.changes.is_empty() {
            outln!("no hash input changed");
        } else {
            outln!("changed hash inputs:");
            for line in dag::key::explain_lines(&e.changes) {
                outln!("  {line}");
            }
        }
    }
    for n in &e.notes {
        outln!("note: {n}");
    }
}
