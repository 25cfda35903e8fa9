//! `orchestrate run`: the spec's nodes in dependency order, then the
//! tables its ops print and what each node's process cost.

use std::collections::BTreeSet;
use std::io::IsTerminal;

use anyhow::{bail, Result};

use super::commands::Ctx;
use super::exit::Status;
use super::keys::open_remote;
use super::plan::print_plan;
use super::shared::*;
use super::transfer::print_transfer;
use super::*;
use orchestrate_core::dag::Dag;
use orchestrate_core::exec::plan::{self};
use orchestrate_core::exec::report::{JsonReporter, PlainReporter, ProgressReporter, Reporter};
use orchestrate_core::exec::{self, RunOptions};
use orchestrate_core::ids::escaped as esc;
use orchestrate_core::remote;
use orchestrate_core::runtime;
use orchestrate_core::spec::parsed::ParseCache;
use orchestrate_core::spec::{self};
use orchestrate_core::store::Workspace;

/// `orchestrate run`: every node not already cached, in dependency order
/// (`--dry-run`: the plan; `--check`: re-execute cached nodes).
pub fn run(ctx: &Ctx, args: RunArgs) -> Result<Status> {
    let RunArgs { spec, targets, jobs, force, dry_run, json, quiet, remote, push, drop_states, check } = args;
    let parsed = std::sync::Arc::new(ParseCache::new(&ctx.workspace));
    let (spec, dag) = load_with(&spec, &ctx.registry, Some(parsed.clone()))?;
    let wanted = if check && !targets.is_empty() { expand_nodes(&dag, targets.clone())? } else { BTreeSet::new() };
    let (spec, dag, force) = select(spec, dag, targets, force)?;
    // `--remote [URL]` consults the remote on a local miss; `--push`
    // uploads what ran (to the same remote, or the configured one).
    let consult = remote
        .remote
        .as_deref()
        .map(|url| open_remote(&ctx.workspace, Some(url), None, &remote.trust, false))
        .transpose()?;
    let push_to = if push {
        Some(open_remote(&ctx.workspace, remote.remote.as_deref(), None, &remote.trust, true)?)
    } else {
        None
    };
    if check {
        let ws = Workspace::open(&ctx.workspace)?;
        save_parsed(&parsed);
        return super::check::run_check(&ws, &spec, &dag, &wanted, consult.as_ref(), push_to.as_ref(), json);
    }
    if dry_run {
        let ws = Workspace::open_read_only(&ctx.workspace)?;
        let force = regenerate_dropped(ws.as_ref(), &spec, &dag, force)?;
        let entries =
            plan::plan_with_remote(ws.as_ref(), &spec, &dag, &force, &runtime::env_provider(), consult.as_ref())?;
        print_plan(&entries, json);
        return Ok(Status::Ok);
    }
    let slurm = if spec.executor == spec::ExecutorKind::Slurm {
        exec::slurm::check_available()?;
        Some(exec::slurm::SlurmSettings::for_this_exe()?)
    } else {
        None
    };
    // Ctrl-C, SIGTERM, SIGHUP: the run stops its nodes and records itself as interrupted.
    exec::signal::install_interrupt_handler();
    let ws = Workspace::open(&ctx.workspace)?;
    save_parsed(&parsed);
    let force = regenerate_dropped(Some(&ws), &spec, &dag, force)?;
    let foreign = ws.foreign_staging();
    if !foreign.is_empty() {
        let shown: Vec<String> = foreign.iter().take(5).map(|f| esc(&f.display().to_string()).into_owned()).collect();
        eprintln!(
            "note: {} entr{} in {} {} not made by orchestrate and {} left alone: {}{}",
            foreign.len(),
            if foreign.len() == 1 { "y" } else { "ies" },
            ws.root().join("tmp").display(),
            if foreign.len() == 1 { "was" } else { "were" },
            if foreign.len() == 1 { "is" } else { "are" },
            shown.join(", "),
            if foreign.len() > 5 { ", …" } else { "" }
        );
    }
    let mut reporter: Box<dyn Reporter> = if json {
        Box::new(JsonReporter)
    } else if !quiet && std::io::stdout().is_terminal() {
        Box::new(ProgressReporter::new().following(ws.root().join("logs")))
    } else {
        Box::new(PlainReporter { quiet })
    };
    let opts = RunOptions {
        jobs,
        force,
        env: runtime::env_provider(),
        argv: std::env::args().collect::<Vec<_>>().join(" "),
        slurm,
        remote: consult,
        drop_states,
    };
    let result = exec::run(&ws, &spec, &dag, &opts, reporter.as_mut())?;
    if !result.dropped_states.is_empty() && !json {
        let bytes: u64 = result.dropped_states.iter().map(|d| d.1).sum();
        eprintln!(
            "dropped {} training state(s) ({}) once their readers finished: {}",
            result.dropped_states.len(),
            orchestrate_core::exec::node::human_bytes(bytes),
            result.dropped_states.iter().map(|d| d.0.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    for e in &result.drop_errors {
        eprintln!("warning: a training state was not dropped: {e}");
    }
    if let Some(e) = &result.unrecorded {
        // A failed node (often the reason, e.g. a full disk) is what the
        // exit code says; a run that succeeded but left no record is an error.
        if result.stats.success() {
            bail!("the run's nodes succeeded (each is cached), but the run could not be recorded: {e}");
        }
        eprintln!(
            "warning: run {} could not be recorded ({e}); `status` and `events` will not show it. \
             Finished nodes stay cached.",
            result.run_id
        );
    }
    if !json && !quiet {
        print_tables(&ws, &dag, &result);
    }
    let mut push_failed = false;
    if let Some(to) = &push_to {
        let index = ws.index()?;
        let mut nodes = Vec::new();
        for o in result.outcomes.values() {
            if let exec::Outcome::Ran { key, .. } = o {
                nodes.extend(index.lookup(key)?);
            }
        }
        let progress = remote::Progress::new(!json && std::io::stderr().is_terminal(), "push");
        let t = remote::push(&ws, to, &nodes, &progress)?;
        push_failed = !t.failed.is_empty();
        print_transfer("pushed", to, &t, json);
    }
    let gates = result.failed_gates(&ws, &dag);
    match &gates {
        Ok(0) => {}
        Ok(n) => eprintln!("{n} gate(s) failed"),
        Err(e) => eprintln!("error: {e}"),
    }
    if let Some((sig, name)) = exec::signal::interrupting_signal().filter(|_| result.interrupted) {
        let slurm = if spec.executor == spec::ExecutorKind::Slurm { " (its Slurm jobs were cancelled)" } else { "" };
        let (mut stopped, mut unstarted) = (Vec::new(), 0usize);
        for (id, o) in &result.outcomes {
            match o {
                exec::Outcome::Failed { .. } => stopped.push(id.as_str()),
                exec::Outcome::Skipped { .. } => unstarted += 1,
                _ => {}
            }
        }
        let stopped = if stopped.is_empty() {
            "none was running".to_string()
        } else {
            let shown: Vec<&str> = stopped.iter().take(5).copied().collect();
            format!("stopped {}{}", shown.join(", "), if stopped.len() > 5 { ", …" } else { "" })
        };
        eprintln!(
            "interrupted by {name}: run {} recorded as interrupted{slurm}; {} nodes finished or were cached and \
             stay cached; {stopped}; {unstarted} never started (run again to go on)",
            result.run_id,
            result.stats.ran + result.stats.cached,
        );
        return Ok(Status::Interrupted(sig));
    }
    free_at_exit(spec, dag);
    Ok(if result.stats.success() && matches!(gates, Ok(0)) && !push_failed { Status::Ok } else { Status::Failed })
}

/// Keeps what this run parsed in the workspace's parse cache, now that the
/// workspace is open: a cache, so a failure is a warning and the run goes on.
fn save_parsed(parsed: &ParseCache) {
    if let Err(e) = parsed.save() {
        eprintln!("warning: the spec's parse was not kept for the next command ({e}); it is parsed again then");
    }
}

/// Prints the outputs ops mark for printing (results tables) after a run,
/// then what each node's process cost.
fn print_tables(ws: &Workspace, dag: &Dag, result: &exec::RunResult) {
    print_outputs(ws, dag, result);
    print_costs(ws, dag, result);
}

/// What each node of the run that measured its costs (training,
/// evaluation) cost, as its record keeps them: a cached node's are those of
/// the run that made it.
fn print_costs(ws: &Workspace, dag: &Dag, result: &exec::RunResult) {
    // Only numerical ops run in a worker, the one process that measures
    // its costs: no other node's row has any to read (and a run without
    // one opens no index connection for this table).
    let mut numerical = dag.nodes.iter().filter(|n| n.op.numerical()).peekable();
    if numerical.peek().is_none() {
        return;
    }
    let Ok(index) = ws.index() else { return };
    let mut rows = String::new();
    for node in numerical {
        let (key, when) = match result.outcomes.get(node.id()) {
            Some(exec::Outcome::Ran { key, .. }) => (key, "this run"),
            Some(exec::Outcome::Cached { key, .. }) => (key, "cached"),
            _ => continue,
        };
        let Some(c) = index.lookup_costs(key).ok().flatten() else { continue };
        let rss = c.process.peak_rss_bytes.map_or("undefined".into(), |b| format!("{:.0}", b as f64 / 1048576.0));
        rows.push_str(&format!("| {} | {} | {:.1} | {rss} | {when} |\n", node.id(), node.op.name(), c.process.seconds));
    }
    if !rows.is_empty() {
        outln!(
            "\ncosts (each node's process, as its record keeps them; never part of a key):\n\
             | node | op | seconds | peak RSS (MB) | measured |\n|---|---|---|---|---|\n{rows}"
        );
    }
}

/// Prints the outputs ops mark for printing (results tables).
fn print_outputs(ws: &Workspace, dag: &Dag, result: &exec::RunResult) {
    for node in &dag.nodes {
        let Some(name) = node.op.printed_output() else { continue };
        let outputs = match result.outcomes.get(node.id()) {
            Some(exec::Outcome::Ran { outputs, .. }) | Some(exec::Outcome::Cached { outputs, .. }) => outputs,
            _ => continue,
        };
        if let Some(out) = outputs.iter().find(|o| o.name == name) {
            if let Ok(text) = std::fs::read_to_string(ws.object_path(&out.object.hash)) {
                outln!("\n{} ({}):\n{text}", node.id(), name);
            }
        }
    }
}
