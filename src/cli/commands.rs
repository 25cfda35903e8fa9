//! Which command runs: each is a function of its own module (cargo-nextest's
//! `dispatch` layout), given the workspace and the op registry, returning how
//! it ended ([`Status`]).

use std::path::PathBuf;

use anyhow::Result;

use super::exit::Status;
use super::{events, pack, plan, results, run, tools, transfer, workspace};
use super::{Cli, Command};
use orchestrate_core::ops::Registry;

/// What every command may need: the workspace folder and the ops.
pub struct Ctx {
    pub workspace: PathBuf,
    pub registry: Registry,
}

pub fn dispatch(cli: Cli) -> Result<Status> {
    let ctx = Ctx { workspace: cli.workspace, registry: Registry::builtin() };
    match cli.command {
        Command::Run(a) => run::run(&ctx, a),
        Command::Plan(a) => plan::plan(&ctx, a),
        Command::Explain(a) => plan::explain(&ctx, a),
        Command::Path(a) => plan::path(&ctx, a),
        Command::Push(a) => transfer::push(&ctx, a),
        Command::Pull(a) => transfer::pull(&ctx, a),
        Command::Checkout(a) => transfer::checkout(&ctx, a),
        Command::Status(a) => workspace::status(&ctx.workspace, a.run, a.limit, a.json),
        Command::Verify => workspace::verify(&ctx.workspace),
        Command::Gc(a) => workspace::gc_cmd(&ctx, a),
        Command::Du(a) => workspace::du(&ctx.workspace, a.limit, a.json),
        Command::Reindex => workspace::reindex(&ctx),
        Command::ExecNode(a) => workspace::exec_node(&a.workspace, &a.key, &ctx.registry),
        Command::Events(a) => events::events(&ctx, a),
        Command::AlertScan(a) => events::alert_scan(&ctx, a),
        Command::Report(a) => results::report(&ctx, a),
        Command::Compare(a) => results::compare(&ctx, a),
        Command::Export(cmd) => results::export(&ctx, cmd),
        Command::Pack(cmd) => pack::pack(&ctx, cmd),
        Command::Audit(a) => pack::audit(&ctx, a),
        Command::Key(cmd) => super::keys::key(cmd),
        Command::Validate(a) => tools::validate(&ctx, a),
        Command::Schema(a) => tools::schema(&ctx, a),
        Command::Ops => tools::ops(&ctx),
        Command::Verifier(cmd) => tools::verifier(cmd),
        Command::Guard(cmd) => tools::guard(&ctx, cmd),
        Command::Generate(args) => tools::generate(args),
        Command::Env => tools::env(),
    }
}
