//! The commands about the workspace itself: `status`, `verify`, `gc`, `du`,
//! `reindex`, and `exec-node` (one Slurm job's node).

use std::collections::BTreeSet;

use anyhow::{bail, Context, Result};

use super::commands::Ctx;
use super::exit::Status;
use super::shared::*;
use super::*;
use orchestrate_core::exec::{self};
use orchestrate_core::ids::{escaped as esc, escaped_lines};
use orchestrate_core::ops::Registry;
use orchestrate_core::runtime;
use orchestrate_core::spec::{self, LoadOptions};
use orchestrate_core::store::Workspace;

pub fn status(root: &std::path::Path, run: Option<String>, limit: usize, json: bool) -> Result<Status> {
    let Some(ws) = Workspace::open_read_only(root)? else {
        outln!("no runs yet (no workspace at {})", root.display());
        return Ok(Status::Ok);
    };
    let index = ws.index()?;
    let runs = index.recent_runs(limit)?;
    let shown = match run {
        Some(r) => {
            if !runs.iter().any(|x| x.run_id == r) && index.recent_runs(usize::MAX >> 1)?.iter().all(|x| x.run_id != r)
            {
                bail!("no run '{r}' in {}", root.display());
            }
            Some(r)
        }
        None => runs.first().map(|r| r.run_id.clone()),
    };
    let mut nodes = Vec::new();
    for node in match &shown {
        Some(r) => index.run_nodes(r)?,
        None => Vec::new(),
    } {
        // What its process cost, from the record of the key it had.
        let costs = match &node.key {
            Some(k) => index.lookup(k)?.and_then(|c| c.costs),
            None => None,
        };
        nodes.push(StatusNode { node, costs });
    }
    if json {
        outln!("{}", serde_json::to_string(&StatusReport { runs, run: shown, nodes })?);
        return Ok(Status::Ok);
    }
    for r in &runs {
        let finished = r.finished_at.as_deref().unwrap_or("-");
        let status = if r.finished_at.is_none() { "interrupted or running" } else { r.status.as_str() };
        let profile = r.profile.as_deref().map(|p| format!(" --profile {p}")).unwrap_or_default();
        outln!(
            "{}  {}{profile}  {status}  {}  (started {}, finished {finished})",
            esc(&r.run_id),
            esc(&r.spec),
            esc(r.summary.as_deref().unwrap_or("")),
            esc(&r.started_at)
        );
    }
    if let Some(r) = shown {
        outln!("\nnodes of {r}:");
        for StatusNode { node: n, costs } in nodes {
            let key = n.key.as_deref().map(|k| &k[..8]).unwrap_or("--------");
            let secs = n.seconds.map(|s| format!("{s:.2}s")).unwrap_or_default();
            // A cached node's own cost is the run that made it.
            let cost = costs.map(|c| format!("  (its process: {})", cost_text(&c))).unwrap_or_default();
            let detail = n.detail.map(|d| format!("  {}", escaped_lines(&d))).unwrap_or_default();
            outln!("  {:<8} {}  {:<28} {secs}{cost}{detail}", n.outcome, esc(key), esc(&n.node_id));
        }
    }
    Ok(Status::Ok)
}

/// What `status --json` prints.
#[derive(serde::Serialize)]
struct StatusReport {
    runs: Vec<orchestrate_core::store::RunRow>,
    /// The run whose nodes are listed (`None`: no run yet).
    run: Option<String>,
    nodes: Vec<StatusNode>,
}

/// One node of the listed run, with what its process cost as its record keeps it.
#[derive(serde::Serialize)]
struct StatusNode {
    #[serde(flatten)]
    node: orchestrate_core::store::RunNodeRow,
    costs: Option<orchestrate_core::costs::NodeCosts>,
}

/// A node's costs in a few words: `46.5 s, peak 554 MB`.
pub(super) fn cost_text(c: &orchestrate_core::costs::NodeCosts) -> String {
    let rss = c.process.peak_rss_bytes.map(|b| format!(", peak {:.0} MB", b as f64 / 1048576.0)).unwrap_or_default();
    format!("{:.1} s{rss}", c.process.seconds)
}

pub fn verify(root: &std::path::Path) -> Result<Status> {
    let Some(ws) = Workspace::open_read_only(root)? else {
        outln!("no workspace at {}: nothing to verify", root.display());
        return Ok(Status::Ok);
    };
    let done = ws.verify()?;
    for p in &done.problems {
        outln!("{p}");
    }
    if done.index_missing {
        outln!(
            "{} objects checked, {} problems; the index (cache.sqlite) is missing: run `orchestrate reindex` to \
             rebuild it from the records",
            done.checked,
            done.problems.len()
        );
        return Ok(Status::Failed);
    }
    outln!("{} outputs checked, {} problems", done.checked, done.problems.len());
    Ok(if done.problems.is_empty() { Status::Ok } else { Status::Failed })
}

/// `orchestrate gc`: what no kept run needs, removed from the store.
pub fn gc_cmd(ctx: &Ctx, args: GcArgs) -> Result<Status> {
    gc(&ctx.workspace, &args)
}

fn gc(root: &std::path::Path, args: &GcArgs) -> Result<Status> {
    use orchestrate_core::store::gc;
    let GcArgs { specs, all_specs, keep_runs, drop_states, keep_pack: packs, empty_trash, dry_run, json } = args;
    let (dry_run, json) = (*dry_run, *json);
    if !root.join("workspace.json").is_file() {
        bail!("no workspace at {}: nothing to collect", root.display());
    }
    let mut policy = gc::KeepPolicy {
        keep_runs: *keep_runs as usize,
        drop_states: *drop_states,
        empty_trash: *empty_trash,
        ..Default::default()
    };
    if !all_specs {
        let mut names = BTreeSet::new();
        for path in specs {
            names.insert(spec::load(path, &LoadOptions::default())?.name);
        }
        policy.specs = Some(names);
    }
    for dir in packs {
        let manifest = orchestrate_core::pack::manifest::Manifest::read(dir)
            .map_err(|e| anyhow::anyhow!("--keep-pack {}: {e}", dir.display()))?;
        for n in &manifest.nodes {
            policy.keys.insert(n.key.clone());
            policy.objects.extend(n.outputs.iter().map(|o| o.blake3.clone()));
        }
    }
    let (plan, verb) = if dry_run {
        // A dry run only reads: no staging cleared, no lock taken, nothing written.
        let ws = Workspace::open_read_only(root)?.with_context(|| format!("no workspace at {}", root.display()))?;
        (gc::plan(&ws, &policy)?, "would remove")
    } else {
        let ws = Workspace::open_exclusive(root)?;
        (gc::collect(&ws, &policy)?, "removed")
    };
    if json {
        outln!("{}", serde_json::to_string(&plan)?);
        return Ok(Status::Ok);
    }
    let human = orchestrate_core::exec::node::human_bytes;
    if dry_run {
        for (spec, node, key) in plan.removed_nodes.iter().take(20) {
            outln!("remove  {spec}  {node}  {}", key.short());
        }
        if plan.removed_nodes.len() > 20 {
            outln!("… and {} more results", plan.removed_nodes.len() - 20);
        }
    }
    if !plan.dropped_states.is_empty() {
        outln!(
            "{} {} training states ({}) of kept results; they stay cached, and a run that needs one runs its node again",
            if dry_run { "would drop" } else { "dropped" },
            plan.dropped_states.len(),
            human(plan.dropped_states.iter().map(|d| d.3).sum())
        );
    }
    if plan.trash_emptied {
        outln!(
            "{verb} the trash: {} sets of outs that runs and checkouts moved aside, whose bytes the store lacked ({})",
            plan.trash_entries,
            human(plan.trash_bytes)
        );
    } else if plan.trash_entries > 0 {
        outln!(
            "{} the trash: {} sets of outs that runs and checkouts moved aside, whose bytes the store lacked ({}; \
             they are yours, not the cache's: look in {}, and `--empty-trash` removes them)",
            if dry_run { "would keep" } else { "kept" },
            plan.trash_entries,
            human(plan.trash_bytes),
            root.join(orchestrate_core::store::TRASH).display()
        );
    }
    outln!(
        "{verb} {} results and {} objects ({}; records and logs {}); kept {} results of {} runs and {} objects ({})",
        plan.removed_nodes.len(),
        plan.removed_objects.len(),
        human(plan.removed_bytes()),
        human(plan.removed_other_bytes),
        plan.kept_nodes,
        plan.kept_runs.len(),
        plan.kept_objects,
        human(plan.kept_bytes)
    );
    Ok(Status::Ok)
}

pub fn du(root: &std::path::Path, limit: usize, json: bool) -> Result<Status> {
    let Some(ws) = Workspace::open_read_only(root)? else {
        bail!("no workspace at {}", root.display());
    };
    let usage = orchestrate_core::store::gc::disk_usage(&ws)?;
    if json {
        outln!("{}", serde_json::to_string(&usage)?);
        return Ok(Status::Ok);
    }
    let human = orchestrate_core::exec::node::human_bytes;
    let shown = &usage.nodes[..usage.nodes.len().min(limit)];
    let w_spec = shown.iter().map(|u| u.spec.len()).max().unwrap_or(4).max(4);
    let w_node = shown.iter().map(|u| u.node.len()).max().unwrap_or(4).max(4);
    outln!("{:<w_spec$}  {:<w_node$}  {:>7}  {:>7}  {:>10}", "SPEC", "NODE", "RESULTS", "OBJECTS", "SIZE");
    for u in shown {
        outln!("{:<w_spec$}  {:<w_node$}  {:>7}  {:>7}  {:>10}", u.spec, u.node, u.keys, u.objects, human(u.bytes));
    }
    if usage.nodes.len() > shown.len() {
        let rest = &usage.nodes[shown.len()..];
        outln!("… {} more nodes, {}", rest.len(), human(rest.iter().map(|u| u.bytes).sum()));
    }
    outln!(
        "store: {} objects, {}; {} objects ({}) named by no result (`orchestrate gc` removes them)",
        usage.objects,
        human(usage.bytes),
        usage.unreferenced_objects,
        human(usage.unreferenced_bytes)
    );
    if usage.trash_entries > 0 {
        outln!(
            "trash: {} sets of outs moved aside, whose bytes the store lacked, {} (`orchestrate gc --empty-trash` removes them)",
            usage.trash_entries,
            human(usage.trash_bytes)
        );
    }
    Ok(Status::Ok)
}

/// `orchestrate reindex`: the index's cache rows rebuilt from the node records.
pub fn reindex(ctx: &Ctx) -> Result<Status> {
    if !ctx.workspace.is_dir() {
        bail!("no workspace at {}", ctx.workspace.display());
    }
    let done = Workspace::open_for_reindex(&ctx.workspace)?.reindex()?;
    for (what, why) in &done.left_out {
        outln!("left out {what}: {why}; it runs again when a spec needs it");
    }
    outln!(
        "{} nodes re-indexed, {} already in the index, {} left out",
        done.added.len(),
        done.present,
        done.left_out.len()
    );
    Ok(Status::Ok)
}

/// One Slurm job: rebuild the submitted node from its ticket and resolve it.
pub fn exec_node(workspace: &std::path::Path, key: &str, registry: &Registry) -> Result<Status> {
    // Checked before anything else: a key names files in the workspace.
    let key = orchestrate_core::store::Key::parse(key)?;
    let ws = Workspace::open(workspace)?;
    let ticket = exec::slurm::read_ticket(ws.root(), &key)?;
    outln!(
        "orchestrate exec-node: node '{}' (key {}) of run {} from {}",
        ticket.node,
        ticket.key,
        ticket.run_id,
        ticket.coordinator
    );
    let loaded = std::env::set_current_dir(&ticket.cwd)
        .map_err(|e| anyhow::anyhow!("cannot enter the coordinator's folder {}: {e}", ticket.cwd.display()))
        .and_then(|()| {
            let args = SpecArgs {
                spec: ticket.spec.clone(),
                profile: ticket.profile.clone(),
                set: ticket.overrides.clone(),
                executor: Default::default(),
            };
            load(&args, registry)
        });
    let outcome = match loaded {
        Ok((spec, dag)) => exec::slurm::exec_node(&ws, &ticket, &spec, &dag, runtime::probe_env)?,
        Err(e) => {
            let outcome = exec::Outcome::Failed {
                key: Some(ticket.key.clone()),
                error: format!("cannot rebuild the node from its spec: {e:#}"),
                seconds: 0.0,
            };
            exec::slurm::record(ws.root(), &ticket, &outcome, 0.0)?;
            outcome
        }
    };
    match outcome {
        exec::Outcome::Ran { seconds, .. } => {
            outln!("done: node '{}' ran in {seconds:.2}s", ticket.node);
            Ok(Status::Ok)
        }
        exec::Outcome::Cached { .. } => {
            outln!("done: node '{}' was already cached", ticket.node);
            Ok(Status::Ok)
        }
        exec::Outcome::Failed { error, .. } | exec::Outcome::Skipped { because: error } => {
            eprintln!("FAILED: node '{}': {error}", ticket.node);
            Ok(Status::Failed)
        }
    }
}
