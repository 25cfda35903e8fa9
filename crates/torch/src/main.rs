//! The libtorch-linked worker behind `orchestrate`: numerical nodes and
//! commands run here, in their own process (see `orchestrate_core::runtime`).

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use orchestrate_torch as torch;

/// The libtorch worker of orchestrate (started by `orchestrate`; run that instead).
#[derive(Parser)]
#[command(name = "orchestrate-torch", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The libtorch version and device.
    Env {
        #[arg(long)]
        json: bool,
    },
    /// Run one numerical node; the job is JSON on stdin.
    RunOp,
    /// Generate a response: `orchestrate generate` hands its request over as JSON.
    Generate {
        #[arg(long, value_name = "JSON")]
        request: String,
    },
    /// Generation and scoring speed on a random model (JSON; used by benches/model.rs).
    #[command(hide = true)]
    Bench {
        #[arg(long, default_value = "tiny")]
        preset: String,
        #[arg(long, default_value_t = 1)]
        batch: usize,
        #[arg(long, default_value_t = 32)]
        prompt_len: usize,
        #[arg(long, default_value_t = 64)]
        new_tokens: usize,
        /// Also time generation without the KV cache.
        #[arg(long)]
        no_cache: bool,
    },
    /// The same random model on the CPU and on ORCHESTRATE_DEVICE: logits and
    /// greedy generation compared (JSON; used by scripts/gpu-check.sh).
    #[command(hide = true)]
    DeviceParity {
        #[arg(long, default_value = "tiny")]
        preset: String,
        #[arg(long, default_value_t = 32)]
        prompt_len: usize,
        #[arg(long, default_value_t = 16)]
        new_tokens: usize,
    },
    /// Seconds per GRPO iteration by cost category (JSON; used by benches/grpo.rs).
    #[command(hide = true)]
    BenchGrpo {
        #[arg(long, default_value = "tiny")]
        preset: String,
        #[arg(long, default_value_t = 96)]
        prompt_len: usize,
        #[arg(long, default_value_t = 4)]
        iterations: usize,
        /// Groups per forward/backward pass of an update (0: the whole batch).
        #[arg(long, default_value_t = 0)]
        micro_groups: usize,
    },
}

fn main() -> ExitCode {
    // First, before the worker starts threads of its own or makes any tensor.
    torch::keep_freed_memory();
    // Deterministic cuBLAS, set before CUDA initialises (TF32 for matmuls is off by default).
    if std::env::var_os("CUBLAS_WORKSPACE_CONFIG").is_none() {
        std::env::set_var("CUBLAS_WORKSPACE_CONFIG", ":4096:8");
    }
    // CUDA's half of libtorch, where a driver can run it; before anything asks libtorch about CUDA.
    if let Err(e) = torch::load_cuda() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse();
    // Intra-op threads: what `env` reports and numerical keys include.
    match orchestrate_core::runtime::worker_threads() {
        Ok(n) => tch::set_num_threads(n as i32),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    let result = match cli.command {
        Command::Env { json } => {
            let env = match torch::env() {
                Ok(env) => env,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            if json {
                let answer = orchestrate_core::runtime::WorkerEnv {
                    env,
                    libtorch_lib: option_env!("ORCHESTRATE_LIBTORCH_LIB").map(std::path::PathBuf::from),
                };
                println!("{}", serde_json::to_string(&answer).expect("env serializes"));
            } else {
                println!(
                    "libtorch {}\ndevice   {}\ncpu      {} {}\nthreads  {}",
                    env.libtorch,
                    env.device,
                    env.cpu.as_deref().unwrap_or("-"),
                    env.cpu_vendor.as_deref().unwrap_or("-"),
                    env.threads.map_or("-".to_string(), |n| n.to_string())
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::RunOp => run_op(),
        Command::Generate { request } => serde_json::from_str::<orchestrate_core::model::GenerateRequest>(&request)
            .context("the generate request (JSON from orchestrate)")
            .and_then(|request| Ok(torch::cli::generate_command(&request)?)),
        Command::DeviceParity { preset, prompt_len, new_tokens } => {
            torch::bench::device_parity(&preset, prompt_len, new_tokens).map_err(anyhow::Error::from).map(|v| {
                println!("{v}");
                ExitCode::SUCCESS
            })
        }
        Command::BenchGrpo { preset, prompt_len, iterations, micro_groups } => {
            torch::bench::grpo_iteration(&preset, prompt_len, iterations, micro_groups)
                .map_err(anyhow::Error::from)
                .map(|v| {
                    println!("{v}");
                    ExitCode::SUCCESS
                })
        }
        Command::Bench { preset, batch, prompt_len, new_tokens, no_cache } => {
            torch::bench::run(&preset, batch, prompt_len, new_tokens, no_cache).map_err(anyhow::Error::from).map(|v| {
                println!("{v}");
                ExitCode::SUCCESS
            })
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Runs the job read on stdin, and leaves its [`WorkerResult`] in the job's
/// staging folder (what it cost, or why it failed, typed), whichever way it ends.
///
/// Stdin is a socket the executor holds the other end of: the job is its
/// first line, and the guard's ledger is served over it after that (the
/// worker opens no database of the workspace).
fn run_op() -> anyhow::Result<ExitCode> {
    use orchestrate_core::guard::{ledger, Ledger};
    use orchestrate_core::ops::worker::{WorkerFailure, WorkerJob, WorkerResult};
    use std::os::fd::AsFd;
    let stdin = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let mut reader = std::io::BufReader::new(stdin.try_clone()?);
    let body = ledger::read_line(&mut reader)?
        .ok_or_else(|| anyhow::anyhow!("the job never came: stdin ended before its first line"))?;
    let job: WorkerJob = serde_json::from_str(&body)?;
    let served = Ledger::served(reader, stdin);
    let (result, code) = match torch::ops::run(&job, served) {
        Ok(done) => (WorkerResult::done(&job.staging, done.costs, done.summary)?, ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: {e}");
            let failure = WorkerFailure { kind: e.kind(), message: e.to_string() };
            (WorkerResult::failed(failure), ExitCode::from(2))
        }
    };
    result.write(&job.staging)?;
    Ok(code)
}
