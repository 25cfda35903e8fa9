//! `orchestrate report`, `compare` and `export`: the read side over runs and packs.

use anyhow::{bail, Context, Result};

use super::commands::Ctx;
use super::exit::Status;
use super::shared::*;
use super::*;
use orchestrate_core::ops::Registry;
use orchestrate_core::store::fsx::refuse_inside_workspace;
use orchestrate_core::store::{write_user_file, Workspace};
use orchestrate_core::view::{self, compare, group, RunView, Side};

/// `orchestrate report`: one self-contained HTML file.
pub fn report(ctx: &Ctx, args: ReportArgs) -> Result<Status> {
    let ReportArgs { targets, out, group_by, profile } = args;
    refuse_inside_workspace(&out, "a report")?;
    let named = if targets.is_empty() {
        let ws = Workspace::open_read_only(&ctx.workspace)?.with_context(|| {
            format!("no workspace at {}: name a run, a spec or a pack folder", ctx.workspace.display())
        })?;
        vec![ws.resolve_run(None)?]
    } else {
        targets
    };
    let sides = named
        .iter()
        .map(|t| compare_side(&ctx.workspace, t, profile.as_deref(), &ctx.registry))
        .collect::<Result<Vec<_>>>()?;
    // Never a half-written report file; a FIFO or device is written into.
    let write =
        |html: String| write_user_file(&out, html.as_bytes()).with_context(|| format!("writing {}", out.display()));
    match (sides.as_slice(), &group_by) {
        ([one], None) => {
            write(view::html::render(&one.view))?;
            outln!("wrote {} ({} nodes)", out.display(), one.view.nodes.len());
        }
        _ => {
            let axis = group_by.as_deref().map(|a| group::resolve_axis(&sides, a));
            write(view::overlay::render(&sides, axis.as_deref()))?;
            outln!("wrote {} ({} runs overlaid)", out.display(), sides.len());
        }
    }
    Ok(Status::Ok)
}

/// `orchestrate compare`: what changed between runs, specs or packs, and why.
pub fn compare(ctx: &Ctx, args: CompareArgs) -> Result<Status> {
    let CompareArgs { targets, profile, all, group_by, json, md } = args;
    let sides = targets
        .iter()
        .map(|t| compare_side(&ctx.workspace, t, profile.as_deref(), &ctx.registry))
        .collect::<Result<Vec<_>>>()?;
    let (text, markdown, value) = if let Some(axis) = &group_by {
        let [side] = sides.as_slice() else {
            bail!("--group-by groups the matrix of one run, spec or pack; {} were named", sides.len());
        };
        let axis = group::resolve_axis(&sides, axis);
        let g = group::group(side, &axis)?;
        (view::text::grouped(&g), view::markdown::grouped(&g), serde_json::to_value(&g)?)
    } else {
        let c = compare::compare(&sides, all);
        (view::text::comparison(&c), view::markdown::comparison(&c), serde_json::to_value(&c)?)
    };
    if json {
        outln!("{}", serde_json::to_string_pretty(&value)?);
    } else if md {
        out!("{markdown}");
    } else {
        out!("{text}");
    }
    Ok(Status::Ok)
}

/// `orchestrate export tensorboard`: a run's or a pack's curves as event files.
pub fn export(ctx: &Ctx, cmd: ExportCommand) -> Result<Status> {
    let ExportCommand::Tensorboard { target, dir, profile } = cmd;
    refuse_inside_workspace(&dir, "an export")?;
    let side = compare_side(&ctx.workspace, &target, profile.as_deref(), &ctx.registry)?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let done = view::tensorboard::export(&side.view, &dir, now)?;
    for (node, path, n) in &done.written {
        outln!("{node}: {n} scalars → {}", path.display());
    }
    for (node, why) in &done.unreadable {
        eprintln!("cannot read the metrics of {node}: {why}");
    }
    if done.written.is_empty() && done.unreadable.is_empty() {
        bail!("{} has no training node (train.sft or train.grpo) with metrics and no shell node declaring metrics or series", side.name);
    }
    Ok(if done.unreadable.is_empty() { Status::Ok } else { Status::Failed })
}

/// One side of `compare`: a pack folder (it has a MANIFEST.json), a spec
/// file (its latest run in the workspace, with `--profile` if given), or a
/// run id of the workspace.
pub(super) fn compare_side(
    workspace: &std::path::Path,
    target: &str,
    profile: Option<&str>,
    registry: &Registry,
) -> Result<Side> {
    let path = std::path::Path::new(target);
    if path.join("MANIFEST.json").exists() {
        let view = RunView::from_pack(path)?;
        return Ok(Side { name: format!("pack {target}"), view });
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
        let view = RunView::from_run(&ws, Some(run.run_id.clone()))?;
        return Ok(Side { name: format!("{target}: {}", view.title), view });
    }
    let ws = open()?;
    let view = RunView::from_run(&ws, Some(target.to_string())).with_context(|| {
        format!("'{target}' is neither a pack folder (with a MANIFEST.json), a spec file, nor a run of the workspace")
    })?;
    Ok(Side { name: view.title.clone(), view })
}
