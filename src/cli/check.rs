//! `run --check [NODE...]`: re-executes cached nodes and says, per node,
//! whether their outputs reproduce (exit 1 on any that does not).

use super::exit::Status;
use std::collections::BTreeSet;
use std::io::IsTerminal;

use anyhow::Result;

use orchestrate_core::dag::Dag;
use orchestrate_core::exec::check::{self, CheckOutcome};
use orchestrate_core::exec::node::human_bytes;
use orchestrate_core::remote;
use orchestrate_core::runtime;
use orchestrate_core::spec::Spec;
use orchestrate_core::store::Workspace;

/// Checks `wanted` (none: every node), taking what this workspace lacks from
/// `consult`; with `push_to` (and its signing key), the nodes that reproduced
/// are pushed there: a record already on the remote is counter-signed.
pub fn run_check(
    ws: &Workspace,
    spec: &Spec,
    dag: &Dag,
    wanted: &BTreeSet<String>,
    consult: Option<&remote::Remote>,
    push_to: Option<&remote::Remote>,
    json: bool,
) -> Result<Status> {
    orchestrate_core::exec::signal::install_interrupt_handler();
    let results = check::check(ws, spec, dag, wanted, &runtime::env_provider(), consult)?;
    let mut bad = 0;
    for r in &results {
        if json {
            println!("{}", serde_json::to_string(r)?);
        }
        let key = r.key.as_ref().map(|k| k.short().to_string()).unwrap_or_default();
        let from = if r.from_remote { " (from the remote)" } else { "" };
        let line = match &r.outcome {
            CheckOutcome::Reproduced => format!("reproduced  {} {key}{from} in {:.1} s", r.node, r.seconds),
            CheckOutcome::Differs { output, cached, rerun, first_difference, rerun_path } => format!(
                "DIFFERS     {} {key}{from}: output '{output}': cached {} ({}), re-executed {} ({}); first difference at {first_difference}; the re-executed bytes: {}",
                r.node,
                &cached.hash[..12],
                human_bytes(cached.size),
                &rerun.hash[..12],
                human_bytes(rerun.size),
                rerun_path.display()
            ),
            CheckOutcome::NotCached { why } => format!("not cached  {}: {why}", r.node),
            CheckOutcome::Failed { error } => format!("FAILED      {} {key}: {error}", r.node),
        };
        bad += usize::from(!r.reproduced());
        if !json {
            if r.reproduced() {
                println!("{line}");
            } else {
                eprintln!("{line}");
            }
        }
    }
    if orchestrate_core::exec::signal::interrupted() {
        eprintln!("interrupted: the nodes after the last one above were not checked");
        bad += 1;
    }
    if let Some(to) = push_to {
        let nodes: Vec<_> = results.iter().filter(|r| r.reproduced()).filter_map(|r| r.cached.clone()).collect();
        let progress = remote::Progress::new(!json && std::io::stderr().is_terminal(), "push");
        let t = remote::push(ws, to, &nodes, &progress)?;
        super::transfer::print_transfer("pushed", to, &t, json);
        bad += t.failed.len();
    }
    if !json {
        let reproduced = results.iter().filter(|r| r.reproduced()).count();
        println!("checked {} node(s): {reproduced} reproduced, {} did not", results.len(), results.len() - reproduced);
    }
    Ok(if bad == 0 { Status::Ok } else { Status::Failed })
}
