//! The commands about specs and tools, not a workspace's results: `validate`,
//! `schema`, `ops`, `verifier`, `guard`, `generate`, `env`.

use anyhow::{bail, Context, Result};

use super::commands::Ctx;
use super::exit::Status;
use super::shared::*;
use super::*;
use orchestrate_core::data::verifier::{FinishReason, Response, VerifierRegistry};
use orchestrate_core::runtime;
use orchestrate_core::spec::{did_you_mean, schema};
use orchestrate_core::store::{write_atomic, Workspace};

/// `orchestrate validate`: a spec checked without running it.
pub fn validate(ctx: &Ctx, args: ValidateArgs) -> Result<Status> {
    let ValidateArgs { spec } = args;
    let (spec, dag) = load(&spec, &ctx.registry)?;
    outln!("{}: ok ({} nodes, {} edges)", spec.path.display(), dag.nodes.len(), dag.graph.edge_count());
    free_at_exit(spec, dag);
    Ok(Status::Ok)
}

/// `orchestrate schema`: the spec JSON Schema, printed or written.
pub fn schema(ctx: &Ctx, args: SchemaArgs) -> Result<Status> {
    let SchemaArgs { out } = args;
    let text = schema::render(&ctx.registry);
    match out {
        None => out!("{text}"),
        Some(dir) => {
            orchestrate_core::store::fsx::refuse_inside_workspace(&dir, "a schema")?;
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
    Ok(Status::Ok)
}

/// `orchestrate ops`: the ops a spec can use.
pub fn ops(ctx: &Ctx) -> Result<Status> {
    for op in ctx.registry.iter() {
        let numerical = if op.numerical() { " [numerical]" } else { "" };
        outln!("{:<24} v{}  {}{numerical}", op.name(), op.version(), op.summary());
    }
    Ok(Status::Ok)
}

/// `orchestrate guard codes|spend-nonce`.
pub fn guard(ctx: &Ctx, cmd: GuardCommand) -> Result<Status> {
    match cmd {
        GuardCommand::Codes => {
            out!("{}", orchestrate_core::guard::codes::table());
            Ok(Status::Ok)
        }
        GuardCommand::SpendNonce { nonce } => {
            let ws = Workspace::open(&ctx.workspace)?;
            let won = orchestrate_core::guard::Ledger::open(&ws)?.consume_nonce(&nonce)?;
            outln!("{}", if won { "won" } else { "lost" });
            Ok(if won { Status::Ok } else { Status::Failed })
        }
    }
}

/// `orchestrate generate`: text from a model, through the worker.
pub fn generate(args: GenerateArgs) -> Result<Status> {
    let request = serde_json::to_string(&args.request())?;
    Ok(runtime::exec_worker(&["generate".to_string(), "--request".to_string(), request]).map(Status::Exited)?)
}

/// `orchestrate env`: what this machine's numerical environment is, as keys see it.
pub fn env() -> Result<Status> {
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
    Ok(Status::Ok)
}

pub fn verifier(cmd: VerifierCommand) -> Result<Status> {
    let registry = VerifierRegistry::builtin();
    match cmd {
        VerifierCommand::List => {
            for v in registry.iter() {
                outln!("{:<22} v{}  {}", v.name(), v.version(), v.protocol_hash());
            }
            Ok(Status::Ok)
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
            Ok(if verdict.reward == 1 { Status::Ok } else { Status::Failed })
        }
    }
}
