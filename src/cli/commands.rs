use std::collections::BTreeSet;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

use super::keys::open_remote;
use super::{Cli, Command, ExportCommand, Finish, GuardCommand, PackCommand, SpecArgs, VerifierCommand};
use orchestrate_core::compare;
use orchestrate_core::dag::{self, Dag};
use orchestrate_core::data::verifier::{FinishReason, Response, VerifierRegistry};
use orchestrate_core::exec::plan::{self, PlanEntry, PlanState};
use orchestrate_core::exec::report::{JsonReporter, PlainReporter, ProgressReporter, Reporter};
use orchestrate_core::exec::{self, RunOptions};
use orchestrate_core::gate;
use orchestrate_core::ids::{escaped as esc, escaped_lines};
use orchestrate_core::ops::Registry;
use orchestrate_core::remote;
use orchestrate_core::runtime;
use orchestrate_core::spec::{self, did_you_mean, schema, LoadOptions, Override, Spec};
use orchestrate_core::store::{write_atomic, Workspace};

const GATE_FAILED: u8 = 1;

pub fn dispatch(cli: Cli) -> Result<ExitCode> {
    let registry = Registry::builtin();
    match cli.command {
        Command::Run { spec, targets, jobs, force, dry_run, json, quiet, remote, push, drop_states, check } => {
            let (spec, dag) = load(&spec, &registry)?;
            let wanted =
                if check && !targets.is_empty() { expand_nodes(&dag, targets.clone())? } else { BTreeSet::new() };
            let (spec, dag, force) = select(spec, dag, targets, force, &registry)?;
            let force = regenerate_dropped(&cli.workspace, &spec, &dag, force)?;
            // `--remote [URL]` consults the remote on a local miss; `--push`
            // uploads what ran (to the same remote, or the configured one).
            let consult = remote
                .remote
                .as_deref()
                .map(|url| open_remote(&cli.workspace, Some(url), None, &remote.trust, false))
                .transpose()?;
            let push_to = if push {
                Some(open_remote(&cli.workspace, remote.remote.as_deref(), None, &remote.trust, true)?)
            } else {
                None
            };
            if check {
                let ws = Workspace::open(&cli.workspace)?;
                return super::check::run_check(&ws, &spec, &dag, &wanted, consult.as_ref(), push_to.as_ref(), json);
            }
            if dry_run {
                let ws = Workspace::open_read_only(&cli.workspace)?;
                let entries = plan::plan_with_remote(
                    ws.as_ref(),
                    &spec,
                    &dag,
                    &force,
                    &runtime::env_provider(),
                    consult.as_ref(),
                )?;
                print_plan(&entries, json);
                return Ok(ExitCode::SUCCESS);
            }
            let slurm = if spec.executor == spec::ExecutorKind::Slurm {
                exec::slurm::check_available().map_err(anyhow::Error::msg)?;
                Some(exec::slurm::SlurmSettings::for_this_exe().map_err(anyhow::Error::msg)?)
            } else {
                None
            };
            // Ctrl-C, SIGTERM, SIGHUP: the run stops its nodes and records itself as interrupted.
            exec::signal::install_interrupt_handler();
            let ws = Workspace::open(&cli.workspace)?;
            let foreign = ws.foreign_staging();
            if !foreign.is_empty() {
                let shown: Vec<String> =
                    foreign.iter().take(5).map(|f| esc(&f.display().to_string()).into_owned()).collect();
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
            let gates = failed_gates(&ws, &dag, &result);
            match &gates {
                Ok(0) => {}
                Ok(n) => eprintln!("{n} gate(s) failed"),
                Err(e) => eprintln!("error: {e}"),
            }
            if let Some((sig, name)) = exec::signal::interrupting_signal().filter(|_| result.interrupted) {
                let slurm =
                    if spec.executor == spec::ExecutorKind::Slurm { " (its Slurm jobs were cancelled)" } else { "" };
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
                return Ok(ExitCode::from((128 + sig).clamp(0, 255) as u8));
            }
            Ok(if result.stats.success() && gates == Ok(0) && !push_failed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(GATE_FAILED)
            })
        }
        Command::ExecNode { workspace, key } => exec_node(&workspace, &key, &registry),
        Command::Plan { spec, targets, force, json, remote } => {
            let (spec, dag) = load(&spec, &registry)?;
            let (spec, dag, force) = select(spec, dag, targets, force, &registry)?;
            let force = regenerate_dropped(&cli.workspace, &spec, &dag, force)?;
            let remote = remote
                .remote
                .as_deref()
                .map(|url| open_remote(&cli.workspace, Some(url), None, &remote.trust, false))
                .transpose()?;
            let ws = Workspace::open_read_only(&cli.workspace)?;
            let entries =
                plan::plan_with_remote(ws.as_ref(), &spec, &dag, &force, &runtime::env_provider(), remote.as_ref())?;
            print_plan(&entries, json);
            let broken = entries.iter().any(|e| matches!(e.state, PlanState::Error { .. }));
            Ok(if broken { ExitCode::from(GATE_FAILED) } else { ExitCode::SUCCESS })
        }
        Command::Explain { spec, node, json } => {
            let (spec, dag) = load(&spec, &registry)?;
            // A matrix node's written id explains each of its expansions.
            let ids = expand_nodes(&dag, vec![node.clone()])?;
            let ws = Workspace::open_read_only(&cli.workspace)?;
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
                return Ok(ExitCode::SUCCESS);
            }
            for (i, e) in all.iter().enumerate() {
                if i > 0 {
                    outln!();
                }
                print_explanation(e);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Path { spec, output } => {
            let (spec, dag) = load(&spec, &registry)?;
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
            let ws = Workspace::open_read_only(&cli.workspace)?;
            let entries = plan::plan(ws.as_ref(), &spec, &dag, &BTreeSet::new(), &runtime::env_provider())?;
            let cached = entries.iter().find(|e| e.node == node).and_then(|e| match &e.state {
                PlanState::Cached { key } => Some(key.clone()),
                _ => None,
            });
            let (Some(ws), Some(key)) = (ws, cached) else {
                eprintln!("'{node}' is not cached as the spec stands: run it first");
                return Ok(ExitCode::from(GATE_FAILED));
            };
            let record = ws.index()?.lookup(&key)?.ok_or_else(|| anyhow::anyhow!("cache row vanished for {key}"))?;
            let out = record
                .outputs
                .iter()
                .find(|o| o.name == name)
                .ok_or_else(|| anyhow::anyhow!("no output '{name}' recorded"))?;
            if let Some(why) = &out.dropped {
                eprintln!(
                    "output '{name}' of '{node}' was {why}: `orchestrate run SPEC --force {node}` makes it again"
                );
                return Ok(ExitCode::from(GATE_FAILED));
            }
            let path = ws.object_path(&out.object.hash);
            outln!("{}", std::path::absolute(&path).unwrap_or(path).display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Validate { spec } => {
            let (spec, dag) = load(&spec, &registry)?;
            outln!("{}: ok ({} nodes, {} edges)", spec.path.display(), dag.nodes.len(), dag.graph.edge_count());
            Ok(ExitCode::SUCCESS)
        }
        Command::Schema { out } => {
            let text = schema::render(&registry);
            match out {
                None => out!("{text}"),
                Some(dir) => {
                    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
                    let mut files = vec![(schema::SCHEMA_FILE, text)];
                    files.extend(schema::data_schemas());
                    for (name, text) in files {
                        let path = dir.join(name);
                        write_atomic(&path, text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
                        outln!("wrote {}", path.display());
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { run, limit, json } => status(&cli.workspace, run, limit, json),
        Command::Events { run, kind, code, node, json } => {
            let ws = Workspace::open_read_only(&cli.workspace)?
                .with_context(|| format!("no workspace at {}", cli.workspace.display()))?;
            let run = ws.resolve_run(run)?;
            let filter = super::events::Filter { kind, code, node };
            let mut shown = 0usize;
            let mut out = std::io::stdout().lock();
            for e in super::events::collect(&ws, &run)?.iter().filter(|e| filter.matches(e)) {
                shown += 1;
                let line = if json { e.to_string() } else { super::events::render(e) };
                // A reader that went away (`| head`) ends the listing quietly.
                if writeln!(out, "{line}").is_err() {
                    return Ok(ExitCode::SUCCESS);
                }
            }
            if !json {
                eprintln!("{shown} event(s) of run {run}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::AlertScan { run, webhook, slack, retries, timeout, dry_run } => {
            let ws = Workspace::open_read_only(&cli.workspace)?
                .with_context(|| format!("no workspace at {}", cli.workspace.display()))?;
            let run = ws.resolve_run(run)?;
            let alerts = super::events::alerts(&super::events::collect(&ws, &run)?);
            for a in &alerts {
                let body = super::events::payload(a, slack);
                if dry_run {
                    outln!("{body}");
                } else {
                    let deadline = std::time::Duration::from_secs(timeout);
                    super::events::post(&webhook, &body, retries, std::time::Duration::from_millis(200), deadline)?;
                }
            }
            eprintln!(
                "{} non-ALLOW decision(s) in run {run}{}",
                alerts.len(),
                if dry_run { " (dry run, nothing posted)" } else { "" }
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Report { targets, out, group_by, profile } => {
            let named = if targets.is_empty() {
                let ws = Workspace::open_read_only(&cli.workspace)?.with_context(|| {
                    format!("no workspace at {}: name a run, a spec or a pack folder", cli.workspace.display())
                })?;
                vec![ws.resolve_run(None)?]
            } else {
                targets
            };
            let sides = named
                .iter()
                .map(|t| compare_side(&cli.workspace, t, profile.as_deref(), &registry))
                .collect::<Result<Vec<_>>>()?;
            // Never a half-written report.
            let write = |html: String| {
                write_atomic(&out, html.as_bytes()).with_context(|| format!("writing {}", out.display()))
            };
            match (sides.as_slice(), &group_by) {
                ([one], None) => {
                    write(orchestrate_core::report::render(&one.source))?;
                    outln!("wrote {} ({} nodes)", out.display(), one.source.nodes.len());
                }
                _ => {
                    let axis = group_by.as_deref().map(|a| compare::resolve_axis(&sides, a));
                    write(orchestrate_core::overlay::render(&sides, axis.as_deref()))?;
                    outln!("wrote {} ({} runs overlaid)", out.display(), sides.len());
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Compare { targets, profile, all, group_by, json, md } => {
            let sides = targets
                .iter()
                .map(|t| compare_side(&cli.workspace, t, profile.as_deref(), &registry))
                .collect::<Result<Vec<_>>>()?;
            let (text, markdown, value) = if let Some(axis) = &group_by {
                let [side] = sides.as_slice() else {
                    bail!("--group-by groups the matrix of one run, spec or pack; {} were named", sides.len());
                };
                let axis = compare::resolve_axis(&sides, axis);
                let g = compare::group(side, &axis).map_err(anyhow::Error::msg)?;
                (g.text(), g.markdown(), serde_json::to_value(&g)?)
            } else {
                let c = compare::compare(&sides, all);
                (c.text(), c.markdown(), serde_json::to_value(&c)?)
            };
            if json {
                outln!("{}", serde_json::to_string_pretty(&value)?);
            } else if md {
                out!("{markdown}");
            } else {
                out!("{text}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Export(ExportCommand::Tensorboard { target, dir, profile }) => {
            let side = compare_side(&cli.workspace, &target, profile.as_deref(), &registry)?;
            let now =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            let done = orchestrate_core::tensorboard::export(&side.source, &dir, now).map_err(anyhow::Error::msg)?;
            for (node, path, n) in &done.written {
                outln!("{node}: {n} scalars → {}", path.display());
            }
            for (node, why) in &done.unreadable {
                eprintln!("cannot read the metrics of {node}: {why}");
            }
            if done.written.is_empty() && done.unreadable.is_empty() {
                bail!("{} has no training node (train.sft or train.grpo) with metrics and no shell node declaring metrics or series", side.name);
            }
            Ok(if done.unreadable.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(GATE_FAILED) })
        }
        Command::Push { spec, profile, all, transfer: super::TransferArgs { remote, jobs, json, trust } } => {
            let to = open_remote(&cli.workspace, remote.as_deref(), jobs, &trust, true)?;
            let ws = Workspace::open_read_only(&cli.workspace)?
                .with_context(|| format!("no workspace at {}: nothing is cached to push", cli.workspace.display()))?;
            let index = ws.index()?;
            let nodes = match spec {
                _ if all => index.all_nodes()?,
                Some(path) => {
                    let args = SpecArgs { spec: path, profile, set: Vec::new(), executor: Default::default() };
                    let (spec, dag) = load(&args, &registry)?;
                    let entries = plan::plan(Some(&ws), &spec, &dag, &BTreeSet::new(), &runtime::env_provider())?;
                    let mut nodes = Vec::new();
                    for e in &entries {
                        if let PlanState::Cached { key } = &e.state {
                            nodes.extend(index.lookup(key)?);
                        }
                    }
                    nodes
                }
                None => bail!("give a spec, or --all"),
            };
            let progress = remote::Progress::new(!json && std::io::stderr().is_terminal(), "push");
            let t = remote::push(&ws, &to, &nodes, &progress)?;
            print_transfer("pushed", &to, &t, json);
            Ok(if t.failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(GATE_FAILED) })
        }
        Command::Pull { spec, targets, transfer: super::TransferArgs { remote, jobs, json, trust } } => {
            let from = open_remote(&cli.workspace, remote.as_deref(), jobs, &trust, false)?;
            let (spec, dag) = load(&spec, &registry)?;
            let (spec, dag, _) = select(spec, dag, targets, Vec::new(), &registry)?;
            let ws = Workspace::open(&cli.workspace)?;
            let progress = remote::Progress::new(!json && std::io::stderr().is_terminal(), "pull");
            let t = plan::pull_spec(&ws, &spec, &dag, &runtime::env_provider(), &from, &progress)?;
            progress.finish();
            print_transfer("pulled", &from, &t, json);
            Ok(if t.failed.is_empty() && t.missing.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(GATE_FAILED)
            })
        }
        Command::Checkout { spec, targets, json } => {
            let (spec, dag) = load(&spec, &registry)?;
            let (spec, dag, _) = select(spec, dag, targets, Vec::new(), &registry)?;
            let ws = Workspace::open(&cli.workspace)?;
            let done = plan::checkout(&ws, &spec, &dag, &runtime::env_provider())?;
            let (mut restored, mut missing) = (0usize, 0usize);
            for d in &done {
                if json {
                    outln!("{}", serde_json::to_string(d)?);
                }
                let line = match d {
                    plan::CheckedOut::UpToDate { node, key } => format!("up to date  {node} {}", key.short()),
                    plan::CheckedOut::Restored { node, key, files, bytes } => {
                        restored += 1;
                        format!(
                            "restored    {node} {} ({})",
                            key.short(),
                            orchestrate_core::exec::node::files_and_bytes(*files, *bytes)
                        )
                    }
                    plan::CheckedOut::Missing { node, reason } => {
                        missing += 1;
                        format!("not stored  {node} ({reason}): `orchestrate run` makes it")
                    }
                    plan::CheckedOut::Below { node, missing: m } => {
                        missing += 1;
                        format!("not stored  {node} (it reads '{m}', which is not stored)")
                    }
                };
                if !json {
                    outln!("{line}");
                }
            }
            if !json {
                outln!(
                    "{restored} restored, {} up to date, {missing} not in the store",
                    done.len() - restored - missing
                );
            }
            Ok(if missing == 0 { ExitCode::SUCCESS } else { ExitCode::from(GATE_FAILED) })
        }
        Command::Ops => {
            for op in registry.iter() {
                let numerical = if op.numerical() { " [numerical]" } else { "" };
                outln!("{:<24} v{}  {}{numerical}", op.name(), op.version(), op.summary());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify => verify(&cli.workspace),
        Command::Gc { specs, all_specs, keep_runs, drop_states, keep_pack, dry_run, json } => {
            gc(&cli.workspace, &specs, all_specs, keep_runs, drop_states, &keep_pack, dry_run, json)
        }
        Command::Du { limit, json } => du(&cli.workspace, limit, json),
        Command::Reindex => {
            if !cli.workspace.is_dir() {
                bail!("no workspace at {}", cli.workspace.display());
            }
            let done = Workspace::open_for_reindex(&cli.workspace)?.reindex()?;
            for (what, why) in &done.left_out {
                outln!("left out {what}: {why}; it runs again when a spec needs it");
            }
            outln!(
                "{} nodes re-indexed, {} already in the index, {} left out",
                done.added.len(),
                done.present,
                done.left_out.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Verifier(cmd) => verifier(cmd),
        Command::Key(cmd) => super::keys::key(cmd),
        Command::Guard(GuardCommand::Codes) => {
            out!("{}", orchestrate_core::guard::codes::table());
            Ok(ExitCode::SUCCESS)
        }
        Command::Guard(GuardCommand::SpendNonce { nonce }) => {
            let ws = Workspace::open(&cli.workspace)?;
            let won = orchestrate_core::guard::Ledger::open(&ws)?.consume_nonce(&nonce)?;
            outln!("{}", if won { "won" } else { "lost" });
            Ok(if won { ExitCode::SUCCESS } else { ExitCode::from(GATE_FAILED) })
        }
        Command::Pack(PackCommand::Freeze { spec, out, with_models, with_states, max_output_bytes }) => {
            let (spec, dag) = load(&spec, &registry)?;
            let Some(ws) = Workspace::open_read_only(&cli.workspace)? else {
                bail!("no workspace at {}: run the spec first", cli.workspace.display());
            };
            let opts = orchestrate_core::pack::FreezeOptions { with_models, with_states, max_output_bytes };
            let manifest = orchestrate_core::pack::freeze(&ws, &spec, &dag, &runtime::env_provider(), &out, opts)?;
            let omitted = manifest.nodes.iter().flat_map(|n| &n.outputs).filter(|o| o.path.is_none()).count();
            outln!(
                "froze {} nodes into {} ({omitted} large outputs listed by hash only)",
                manifest.nodes.len(),
                out.display()
            );
            let root = orchestrate_core::pack::root_digest(&out)?;
            outln!("root digest {root} (the SHA-256 of its SHA256SUMS: put it in the release note or tag)");
            match &manifest.events.run_id {
                Some(run_id) => {
                    let event = exec::Event::PackFrozen {
                        run_id: run_id.clone(),
                        pack: out.display().to_string(),
                        root: root.clone(),
                    };
                    Workspace::open(&cli.workspace)?.index()?.append_event(run_id, &event.to_json())?;
                    outln!("recorded in the events of run {run_id}");
                }
                None => outln!("not recorded in any run's events: the spec has no run in this workspace"),
            }
            outln!(
                "check it with: orchestrate audit {} --expect {root}   (or: cd {} && sha256sum -c SHA256SUMS)",
                out.display(),
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Pack(PackCommand::Sign { dir, key }) => super::keys::sign_pack(&dir, &key),
        Command::Pack(PackCommand::Verify { dir, expect, key }) => {
            let mut problems = pack_problems(&dir, expect.as_deref())?;
            if let Some(key) = &key {
                problems.extend(super::keys::pack_signature(&dir, key)?);
            }
            if problems.is_empty() {
                outln!("{}: intact (checksums, files, event chain, manifest hashes)", dir.display());
                Ok(ExitCode::SUCCESS)
            } else {
                Ok(ExitCode::from(GATE_FAILED))
            }
        }
        Command::Audit { dir, expect, key } => {
            let mut problems = pack_problems(&dir, expect.as_deref())?;
            if let Some(key) = &key {
                problems.extend(super::keys::pack_signature(&dir, key)?);
            }
            // A pack whose gates cannot even be evaluated (an unreadable manifest
            // or gate definition) fails its audit; it is not a usage error.
            let results = match orchestrate_core::pack::audit_gates(&dir) {
                Ok(results) => results,
                Err(e) => {
                    outln!("FAIL  the gates cannot be evaluated: {e}");
                    outln!("pack TAMPERED or unreadable");
                    return Ok(ExitCode::from(GATE_FAILED));
                }
            };
            out!("{}", orchestrate_core::pack::gate_table(&results));
            let failed = results.iter().filter(|r| !r.passed).count();
            outln!(
                "{} gates: {} passed, {failed} failed; pack {}",
                results.len(),
                results.len() - failed,
                if problems.is_empty() { "intact" } else { "TAMPERED" }
            );
            Ok(if problems.is_empty() && failed == 0 { ExitCode::SUCCESS } else { ExitCode::from(GATE_FAILED) })
        }
        Command::Generate(args) => {
            let request = serde_json::to_string(&args.request())?;
            runtime::exec_worker(&["generate".to_string(), "--request".to_string(), request])
                .map_err(anyhow::Error::msg)
        }
        Command::Env => {
            let env = (runtime::env_provider())().map_err(anyhow::Error::msg)?;
            outln!("libtorch {}", env.libtorch);
            outln!("device   {}", env.device);
            outln!(
                "cpu      {} {} (libtorch's CPU kernels and the vendor, keyed with the device)",
                env.cpu.as_deref().unwrap_or("-"),
                env.cpu_vendor.as_deref().unwrap_or("-")
            );
            if let Some(model) = runtime::cpu_model() {
                outln!("model    {model} (not keyed)");
            }
            outln!(
                "threads  {} per numerical node ({}; keyed), at most {} such nodes at once on this CPU",
                env.threads.map_or("-".to_string(), |n| n.to_string()),
                runtime::THREADS_VAR,
                runtime::cpu_slots(env.threads.unwrap_or(1))
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The remote of `push`, `pull` and `run --remote`: the URL given (empty:
/// the configured one), else ORCHESTRATE_REMOTE, else the workspace config.
/// Missing credentials and a bad URL are usage errors (exit 2).
pub(super) fn print_transfer(verb: &str, r: &remote::Remote, t: &remote::Transfer, json: bool) {
    if json {
        outln!("{}", serde_json::to_string(t).expect("a transfer serializes"));
    } else {
        outln!(
            "{verb} {} nodes ({} objects, {} bytes) {} {}; {} already there",
            t.nodes,
            t.objects,
            t.bytes,
            if verb == "pushed" { "to" } else { "from" },
            r.url,
            t.present
        );
    }
    if verb == "pushed" && !json {
        match &r.signer {
            Some(k) if t.countersigned > 0 => {
                outln!("signed with key '{}'; counter-signed {} record(s) already there", k.name, t.countersigned)
            }
            Some(k) => outln!("signed with key '{}'", k.name),
            None if t.nodes > 0 => eprintln!(
                "note: the records were pushed unsigned (no signing key: `orchestrate key generate NAME`, then \
                 --key NAME or `signing_key: NAME` in the workspace's config.yaml)"
            ),
            None => {}
        }
    }
    for u in &t.unverified {
        eprintln!("unverified (taken by --trust-unsigned): {u}");
    }
    for m in &t.missing {
        eprintln!("not on the remote: {m}");
    }
    for f in &t.failed {
        eprintln!("failed: {f}");
    }
}

/// One side of `compare`: a pack folder (it has a MANIFEST.json), a spec
/// file (its latest run in the workspace, with `--profile` if given), or a
/// run id of the workspace.
fn compare_side(
    workspace: &std::path::Path,
    target: &str,
    profile: Option<&str>,
    registry: &Registry,
) -> Result<compare::Side> {
    let path = std::path::Path::new(target);
    if path.join("MANIFEST.json").exists() {
        let source = orchestrate_core::pack::report_source(path)?;
        return Ok(compare::Side { name: format!("pack {target}"), source });
    }
    let open = || -> Result<Workspace> {
        Workspace::open_read_only(workspace)?.with_context(|| {
            format!(
                "'{target}' is not a pack folder (no MANIFEST.json) and there is no workspace at {} to find it as a run or a spec's run",
                workspace.display()
            )
        })
    };
    if path.is_file() {
        let args = SpecArgs {
            spec: path.to_path_buf(),
            profile: profile.map(str::to_string),
            set: Vec::new(),
            executor: Default::default(),
        };
        let (spec, _) = load(&args, registry)?;
        let ws = open()?;
        let run = ws
            .index()?
            .recent_runs(usize::MAX >> 1)?
            .into_iter()
            .find(|r| r.spec == spec.name && r.profile == spec.profile)
            .with_context(|| {
                let p = spec.profile.as_deref().map(|p| format!(" --profile {p}")).unwrap_or_default();
                format!("no run of spec '{}'{p} ({target}) in {}", spec.name, ws.root().display())
            })?;
        let source = orchestrate_core::report::from_run(&ws, Some(run.run_id.clone()))?;
        return Ok(compare::Side { name: format!("{target}: {}", source.title), source });
    }
    let ws = open()?;
    let source = orchestrate_core::report::from_run(&ws, Some(target.to_string())).with_context(|| {
        format!("'{target}' is neither a pack folder (with a MANIFEST.json), a spec file, nor a run of the workspace")
    })?;
    Ok(compare::Side { name: source.title.clone(), source })
}

/// `force` plus every cached node whose dropped state (`gc --drop-states`)
/// a node that will run reads, each said on stderr.
fn regenerate_dropped(
    root: &std::path::Path,
    spec: &Spec,
    dag: &Dag,
    mut force: BTreeSet<String>,
) -> Result<BTreeSet<String>> {
    // A workspace or index that cannot be read is left to the command's own
    // opening of it, which says what is wrong and how to recover, once.
    let Ok(ws) = Workspace::open_read_only(root) else { return Ok(force) };
    let Ok(needed) = plan::dropped_needed(ws.as_ref(), spec, dag, &force, &runtime::env_provider()) else {
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

#[allow(clippy::too_many_arguments)]
fn gc(
    root: &std::path::Path,
    specs: &[std::path::PathBuf],
    all_specs: bool,
    keep_runs: u64,
    drop_states: bool,
    packs: &[std::path::PathBuf],
    dry_run: bool,
    json: bool,
) -> Result<ExitCode> {
    use orchestrate_core::store::gc;
    if !root.join("workspace.json").is_file() {
        bail!("no workspace at {}: nothing to collect", root.display());
    }
    let mut policy = gc::KeepPolicy { keep_runs: keep_runs as usize, drop_states, ..Default::default() };
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
        return Ok(ExitCode::SUCCESS);
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
    Ok(ExitCode::SUCCESS)
}

fn du(root: &std::path::Path, limit: usize, json: bool) -> Result<ExitCode> {
    let Some(ws) = Workspace::open_read_only(root)? else {
        bail!("no workspace at {}", root.display());
    };
    let usage = orchestrate_core::store::gc::disk_usage(&ws)?;
    if json {
        outln!("{}", serde_json::to_string(&usage)?);
        return Ok(ExitCode::SUCCESS);
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
    Ok(ExitCode::SUCCESS)
}

fn load(args: &SpecArgs, registry: &Registry) -> Result<(Spec, Dag)> {
    let overrides = args.set.iter().map(|s| Override::parse(s)).collect::<Result<Vec<_>, _>>()?;
    let opts = LoadOptions { profile: args.profile.clone(), overrides };
    let mut spec = spec::load(&args.spec, &opts)?;
    let x = &args.executor;
    if let Some(kind) = x.executor {
        spec.executor = kind.into();
    }
    let cli = spec::SlurmResources {
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
    for node in &mut spec.nodes {
        node.resources = cli.over(&node.resources);
    }
    let dag = dag::compile(&spec, registry)?;
    if spec.executor == spec::ExecutorKind::Slurm {
        exec::slurm::check_resources(&dag).map_err(|e| anyhow::anyhow!("{}: {e}", args.spec.display()))?;
    }
    Ok((spec, dag))
}

/// One Slurm job: rebuild the submitted node from its ticket and resolve it.
fn exec_node(workspace: &std::path::Path, key: &str, registry: &Registry) -> Result<ExitCode> {
    // Checked before anything else: a key names files in the workspace.
    let key = orchestrate_core::store::Key::parse(key)?;
    let ws = Workspace::open(workspace)?;
    let ticket = exec::slurm::read_ticket(ws.root(), &key).map_err(anyhow::Error::msg)?;
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
        Ok((spec, dag)) => {
            exec::slurm::exec_node(&ws, &ticket, &spec, &dag, runtime::probe_env).map_err(anyhow::Error::msg)?
        }
        Err(e) => {
            let outcome = exec::Outcome::Failed {
                key: Some(ticket.key.clone()),
                error: format!("cannot rebuild the node from its spec: {e:#}"),
                seconds: 0.0,
            };
            exec::slurm::record(ws.root(), &ticket, &outcome, 0.0).map_err(anyhow::Error::msg)?;
            outcome
        }
    };
    match outcome {
        exec::Outcome::Ran { seconds, .. } => {
            outln!("done: node '{}' ran in {seconds:.2}s", ticket.node);
            Ok(ExitCode::SUCCESS)
        }
        exec::Outcome::Cached { .. } => {
            outln!("done: node '{}' was already cached", ticket.node);
            Ok(ExitCode::SUCCESS)
        }
        exec::Outcome::Failed { error, .. } | exec::Outcome::Skipped { because: error } => {
            eprintln!("FAILED: node '{}': {error}", ticket.node);
            Ok(ExitCode::from(GATE_FAILED))
        }
    }
}

/// The targets of `run`/`plan NODE...` and what they need: the spec and DAG cut
/// down to them (keys never depend on other nodes, so each key is the one the
/// whole spec gives), and the forced node ids, which must lie inside the cut.
fn select(
    mut spec: Spec,
    dag: Dag,
    targets: Vec<String>,
    force: Vec<String>,
    registry: &Registry,
) -> Result<(Spec, Dag, BTreeSet<String>)> {
    let forced = expand_nodes(&dag, force)?;
    if targets.is_empty() {
        return Ok((spec, dag, forced));
    }
    let named = expand_nodes(&dag, targets)?;
    let mut keep = vec![false; dag.nodes.len()];
    let mut stack: Vec<usize> = named.iter().filter_map(|id| dag.position(id)).collect();
    while let Some(pos) = stack.pop() {
        if !std::mem::replace(&mut keep[pos], true) {
            stack.extend(dag.parents(pos));
        }
    }
    if let Some(outside) = forced.iter().find(|id| dag.position(id).is_some_and(|p| !keep[p])) {
        bail!(
            "--force {outside}: not one of the targets ({}) or a node they need",
            named.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    spec.nodes.retain(|n| dag.position(&n.id).is_some_and(|p| keep[p]));
    let dag = orchestrate_core::dag::compile(&spec, registry)?;
    Ok((spec, dag, forced))
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

fn check_nodes(dag: &Dag, ids: Vec<String>) -> Result<BTreeSet<String>> {
    for id in &ids {
        if dag.get(id).is_none() {
            return Err(no_such_node(dag, id));
        }
    }
    Ok(ids.into_iter().collect())
}

fn no_such_node(dag: &Dag, id: &str) -> anyhow::Error {
    let ids = dag.ids();
    anyhow::anyhow!("no node '{id}' in this spec{}; nodes: {}", did_you_mean(id, ids.iter().copied()), ids.join(", "))
}

/// The node ids named by `--force`. A node's written id (`grpo`) names
/// every expansion of its matrix (`grpo@seed=0`, `grpo@seed=1`), as `events
/// --node` does and as DVC's `repro` does for a `foreach` stage.
fn expand_nodes(dag: &Dag, ids: Vec<String>) -> Result<BTreeSet<String>> {
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

fn print_plan(entries: &[PlanEntry], json: bool) {
    if json {
        for e in entries {
            outln!("{}", serde_json::to_string(e).expect("plan entries serialize"));
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
                outln!("{:<width$}  cached   {}", e.node, &key[..8]);
            }
            PlanState::Restore { key, reason } => {
                cached += 1;
                outln!("{:<width$}  restore  {}  {reason}; checked out of the store, not run", e.node, &key[..8]);
            }
            PlanState::CachedRemote { key, remote } => {
                cached += 1;
                outln!("{:<width$}  cached (remote) {}  from {remote}", e.node, &key[..8]);
            }
            PlanState::Run { key, reason } => {
                run += 1;
                outln!("{:<width$}  run      {}  {reason}", e.node, short(key));
            }
            PlanState::Pending { after } => {
                pending += 1;
                outln!(
                    "{:<width$}  pending  --------  runs only if {} produce{} different outputs",
                    e.node,
                    after.join(", "),
                    if after.len() == 1 { "s" } else { "" }
                );
            }
            PlanState::Error { error } => {
                outln!("{:<width$}  error    --------  {error}", e.node)
            }
        }
    }
    outln!("{cached} cached, {run} to run, {pending} pending on upstream");
}

fn status(root: &std::path::Path, run: Option<String>, limit: usize, json: bool) -> Result<ExitCode> {
    let Some(ws) = Workspace::open_read_only(root)? else {
        outln!("no runs yet (no workspace at {})", root.display());
        return Ok(ExitCode::SUCCESS);
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
        return Ok(ExitCode::SUCCESS);
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
    Ok(ExitCode::SUCCESS)
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

/// At most this many of a pack's problems are printed, then their count.
const SHOWN_PROBLEMS: usize = 20;

/// Verifies a pack (and its root digest, when one is expected), printing its
/// problems, bounded: a crafted pack can have a hundred thousand.
fn pack_problems(dir: &std::path::Path, expect: Option<&str>) -> Result<Vec<String>> {
    let mut problems = orchestrate_core::pack::verify(dir)?;
    match orchestrate_core::pack::root_digest(dir) {
        Ok(root) => match expect {
            Some(expected) if root != expected => problems.insert(
                0,
                format!("root digest {root} differs from the expected {expected}: this is not the released pack"),
            ),
            Some(_) => outln!("root {root} (as expected)"),
            None => outln!("root {root}"),
        },
        Err(e) => {
            if expect.is_some() {
                problems.insert(0, format!("root digest cannot be computed: {e}"));
            }
        }
    }
    for p in problems.iter().take(SHOWN_PROBLEMS) {
        outln!("FAIL  {p}");
    }
    if problems.len() > SHOWN_PROBLEMS {
        outln!(
            "FAIL  ... {} problems in all; the first {SHOWN_PROBLEMS} are shown (`sha256sum -c SHA256SUMS` in the pack lists the files)",
            problems.len()
        );
    }
    Ok(problems)
}

fn verify(root: &std::path::Path) -> Result<ExitCode> {
    let Some(ws) = Workspace::open_read_only(root)? else {
        outln!("no workspace at {}: nothing to verify", root.display());
        return Ok(ExitCode::SUCCESS);
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
        return Ok(ExitCode::from(GATE_FAILED));
    }
    outln!("{} outputs checked, {} problems", done.checked, done.problems.len());
    Ok(if done.problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(GATE_FAILED) })
}

fn verifier(cmd: VerifierCommand) -> Result<ExitCode> {
    let registry = VerifierRegistry::builtin();
    match cmd {
        VerifierCommand::List => {
            for v in registry.iter() {
                outln!("{:<22} v{}  {}", v.name(), v.version(), v.protocol_hash());
            }
            Ok(ExitCode::SUCCESS)
        }
        VerifierCommand::Check { name, problem, finish, undecodable, keep_newline } => {
            let Some(v) = registry.get(&name) else {
                let names: Vec<&str> = registry.iter().map(|v| v.name()).collect();
                bail!(
                    "no verifier '{name}'{}; verifiers: {}",
                    did_you_mean(&name, names.iter().copied()),
                    names.join(", ")
                );
            };
            let problem: serde_json::Value =
                serde_json::from_str(&problem).with_context(|| format!("--problem is not JSON: {problem}"))?;
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .context("reading the response from stdin")?;
            if !keep_newline {
                if let Some(stripped) = text.strip_suffix('\n') {
                    text = stripped.to_string();
                }
            }
            let finish = match finish {
                Finish::Eos => FinishReason::Eos,
                Finish::Length => FinishReason::Length,
            };
            let verdict = v.verify(&problem, &Response { text: &text, finish, tokenization_valid: !undecodable })?;
            outln!("{}", serde_json::to_string(&verdict)?);
            Ok(if verdict.reward == 1 { ExitCode::SUCCESS } else { ExitCode::from(GATE_FAILED) })
        }
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
    let Ok(index) = ws.index() else { return };
    let mut rows = String::new();
    for node in &dag.nodes {
        let (key, when) = match result.outcomes.get(node.id()) {
            Some(exec::Outcome::Ran { key, .. }) => (key, "this run"),
            Some(exec::Outcome::Cached { key, .. }) => (key, "cached"),
            _ => continue,
        };
        let Some(c) = index.lookup(key).ok().flatten().and_then(|c| c.costs) else { continue };
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

/// Gates evaluated in this run (ran or cached) that failed.
/// How many gates failed in this run's gate nodes. A gate report that cannot be
/// read is an error naming the node and the file: it must never count as passed.
fn failed_gates(ws: &Workspace, dag: &Dag, result: &exec::RunResult) -> Result<usize, String> {
    let mut failed = 0;
    for node in dag.nodes.iter().filter(|n| n.op.name() == "gate") {
        let outputs = match result.outcomes.get(node.id()) {
            Some(exec::Outcome::Ran { outputs, .. }) | Some(exec::Outcome::Cached { outputs, .. }) => outputs,
            // A gate node that failed or was skipped is already a failed run.
            _ => continue,
        };
        let out = outputs
            .iter()
            .find(|o| o.name == "gates.json")
            .ok_or_else(|| format!("gate node '{}' has no gates.json output", node.id()))?;
        let report = gate::GateReport::read(&ws.object_path(&out.object.hash))
            .map_err(|e| format!("gate node '{}': gates.json {e}", node.id()))?;
        failed += report.failed();
    }
    Ok(failed)
}
