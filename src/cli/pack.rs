//! `orchestrate pack` and `audit`: release packs, frozen, signed and checked from the pack alone.

use anyhow::{bail, Result};

use super::commands::Ctx;
use super::exit::Status;
use super::shared::*;
use super::*;
use orchestrate_core::exec::{self};
use orchestrate_core::runtime;
use orchestrate_core::store::Workspace;

/// `orchestrate pack freeze|sign|verify`.
pub fn pack(ctx: &Ctx, cmd: PackCommand) -> Result<Status> {
    match cmd {
        PackCommand::Freeze { spec, out, with_models, with_states, max_output_bytes } => freeze(
            ctx,
            &spec,
            &out,
            orchestrate_core::pack::FreezeOptions {
                with_models,
                with_states,
                max_output_bytes,
                report: Some(|dir, title| Ok(orchestrate_core::view::html::pack_report(dir, title)?)),
            },
        ),
        PackCommand::Sign { dir, key } => super::keys::sign_pack(&dir, &key),
        PackCommand::Verify { dir, expect, key } => verify(&dir, expect.as_deref(), key.as_deref()),
    }
}

/// Freezes a spec's cached results into a release pack.
fn freeze(
    ctx: &Ctx,
    spec: &SpecArgs,
    out: &std::path::Path,
    opts: orchestrate_core::pack::FreezeOptions,
) -> Result<Status> {
    orchestrate_core::store::fsx::refuse_inside_workspace(out, "a pack")?;
    let (spec, dag) = load(spec, &ctx.registry)?;
    let Some(ws) = Workspace::open_read_only(&ctx.workspace)? else {
        bail!("no workspace at {}: run the spec first", ctx.workspace.display());
    };
    let manifest = orchestrate_core::pack::freeze(&ws, &spec, &dag, &runtime::env_provider(), out, opts)?;
    let omitted = manifest.nodes.iter().flat_map(|n| &n.outputs).filter(|o| o.path.is_none()).count();
    outln!("froze {} nodes into {} ({omitted} large outputs listed by hash only)", manifest.nodes.len(), out.display());
    let root = orchestrate_core::pack::root_digest(out)?;
    outln!("root digest {root} (the SHA-256 of its SHA256SUMS: put it in the release note or tag)");
    match &manifest.events.run_id {
        Some(run_id) => {
            let event =
                exec::Event::PackFrozen { run_id: run_id.clone(), pack: out.display().to_string(), root: root.clone() };
            Workspace::open(&ctx.workspace)?.index()?.append_event(run_id, &event.to_json())?;
            outln!("recorded in the events of run {run_id}");
        }
        None => outln!("not recorded in any run's events: the spec has no run in this workspace"),
    }
    outln!(
        "check it with: orchestrate audit {} --expect {root}   (or: cd {} && sha256sum -c SHA256SUMS)",
        out.display(),
        out.display()
    );
    Ok(Status::Ok)
}

/// A pack's integrity (and its signature, with a key).
fn verify(dir: &std::path::Path, expect: Option<&str>, key: Option<&str>) -> Result<Status> {
    let mut problems = pack_problems(dir, expect)?;
    if let Some(key) = &key {
        problems.extend(super::keys::pack_signature(dir, key)?);
    }
    if problems.is_empty() {
        outln!("{}: intact (checksums, files, event chain, manifest hashes)", dir.display());
        Ok(Status::Ok)
    } else {
        Ok(Status::Failed)
    }
}

/// `orchestrate audit`: a pack's integrity and its gates, from the pack alone.
pub fn audit(_ctx: &Ctx, args: AuditArgs) -> Result<Status> {
    let AuditArgs { dir, expect, key } = args;
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
            return Ok(Status::Failed);
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
    Ok(if problems.is_empty() && failed == 0 { Status::Ok } else { Status::Failed })
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
