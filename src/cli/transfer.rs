//! `orchestrate push`, `pull` and `checkout`: the store, the remote and the user's tree.

use std::collections::BTreeSet;
use std::io::IsTerminal;

use anyhow::{bail, Context, Result};

use super::commands::Ctx;
use super::exit::Status;
use super::keys::open_remote;
use super::shared::*;
use super::*;
use orchestrate_core::exec::plan::{self, PlanState};
use orchestrate_core::remote;
use orchestrate_core::runtime;
use orchestrate_core::store::Workspace;

/// `orchestrate push`: cached nodes to the remote.
pub fn push(ctx: &Ctx, args: PushArgs) -> Result<Status> {
    let PushArgs { spec, profile, all, transfer: super::TransferArgs { remote, jobs, json, trust } } = args;
    let to = open_remote(&ctx.workspace, remote.as_deref(), jobs, &trust, true)?;
    let ws = Workspace::open_read_only(&ctx.workspace)?
        .with_context(|| format!("no workspace at {}: nothing is cached to push", ctx.workspace.display()))?;
    let index = ws.index()?;
    let nodes = match spec {
        _ if all => index.all_nodes()?,
        Some(path) => {
            let args = SpecArgs { spec: path, profile, set: Vec::new(), executor: Default::default() };
            let (spec, dag) = load(&args, &ctx.registry)?;
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
    Ok(if t.failed.is_empty() { Status::Ok } else { Status::Failed })
}

/// `orchestrate pull`: what a run of the spec needs, from the remote.
pub fn pull(ctx: &Ctx, args: PullArgs) -> Result<Status> {
    let PullArgs { spec, targets, transfer: super::TransferArgs { remote, jobs, json, trust } } = args;
    let from = open_remote(&ctx.workspace, remote.as_deref(), jobs, &trust, false)?;
    let (spec, dag) = load(&spec, &ctx.registry)?;
    let (spec, dag, _) = select(spec, dag, targets, Vec::new())?;
    let ws = Workspace::open(&ctx.workspace)?;
    let progress = remote::Progress::new(!json && std::io::stderr().is_terminal(), "pull");
    let t = plan::pull_spec(&ws, &spec, &dag, &runtime::env_provider(), &from, &progress)?;
    progress.finish();
    print_transfer("pulled", &from, &t, json);
    Ok(if t.failed.is_empty() && t.missing.is_empty() { Status::Ok } else { Status::Failed })
}

/// `orchestrate checkout`: the outs in the tree made to match the store.
pub fn checkout(ctx: &Ctx, args: CheckoutArgs) -> Result<Status> {
    let CheckoutArgs { spec, targets, force, json } = args;
    let (spec, dag) = load(&spec, &ctx.registry)?;
    let (spec, dag, _) = select(spec, dag, targets, Vec::new())?;
    let ws = Workspace::open(&ctx.workspace)?;
    let done = plan::checkout(&ws, &spec, &dag, &runtime::env_provider(), force)?;
    let (mut restored, mut missing, mut kept) = (0usize, 0usize, 0usize);
    for d in &done {
        if json {
            outln!("{}", serde_json::to_string(d)?);
        }
        let line = match d {
            plan::CheckedOut::UpToDate { node, key } => format!("up to date  {node} {}", key.short()),
            plan::CheckedOut::Restored { node, key, files, bytes, moved } => {
                restored += 1;
                let mut what = orchestrate_core::exec::node::files_and_bytes(*files, *bytes);
                for m in moved {
                    what.push_str(&format!("; {m}"));
                }
                format!("restored    {node} {} ({what})", key.short())
            }
            plan::CheckedOut::Kept { node, key, outs, .. } => {
                kept += 1;
                let outs: Vec<String> = outs.iter().map(|o| format!("out '{}': {}", o.path, o.changes)).collect();
                format!(
                    "kept        {node} {} ({}; the store does not have these bytes: --force replaces them)",
                    key.short(),
                    outs.join("; ")
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
        let up_to_date = done.len() - restored - missing - kept;
        let kept = if kept > 0 { format!(", {kept} kept (edited; --force replaces)") } else { String::new() };
        outln!("{restored} restored, {up_to_date} up to date, {missing} not in the store{kept}");
    }
    Ok(if missing == 0 && kept == 0 { Status::Ok } else { Status::Failed })
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
