//! The worker's implementations of numerical ops.

use crate::error::{Context, Result};
use orchestrate_core::costs::NodeCosts;
use orchestrate_core::guard::Ledger;
use orchestrate_core::model::TextTokenizer;
use orchestrate_core::ops::worker::{WorkerJob, WorkerTask};
use orchestrate_core::ops::ModelInitParams;
use orchestrate_core::store::fsx;
use orchestrate_core::train::metrics::TrainingSummary;
use tch::Device;

use super::decoder::CausalLm;

/// What a job reports beside its outputs.
#[derive(Debug, Default)]
pub struct Done {
    /// What its process cost, for an op that measures it.
    pub costs: Option<NodeCosts>,
    /// A training op's headline figures.
    pub summary: Option<TrainingSummary>,
}

/// Runs one job from `orchestrate run`. `ledger` is the guard's ledger as the
/// executor serves it (only GRPO asks it anything).
pub fn run(job: &WorkerJob, ledger: Ledger) -> Result<Done> {
    let trained = |(costs, summary)| Done { costs: Some(costs), summary: Some(summary) };
    match job.task.clone() {
        WorkerTask::ModelInit(p) => model_init(job, p).map(|()| Done::default()),
        WorkerTask::TrainSft(p) => super::train::sft::run(job, p).map(trained),
        WorkerTask::TrainGrpo(p) => super::train::grpo::run(job, p, ledger).map(trained),
        WorkerTask::EvalGenerate(p) => super::eval::run(job, p).map(|c| Done { costs: Some(c), summary: None }),
        WorkerTask::Replay(p) => super::train::replay::run(job, p).map(|()| Done::default()),
    }
}

fn model_init(job: &WorkerJob, p: ModelInitParams) -> Result<()> {
    let tokenizer_path = job.inputs.get("tokenizer").and_then(|v| v.first()).context("input 'tokenizer' is missing")?;
    let tokenizer = TextTokenizer::from_file(tokenizer_path)?;
    let eos = tokenizer.eos_id()?;
    let config = p.config(tokenizer.vocab_size() as usize, eos)?;
    let vocab = config.vocab_size;
    // Initialised on the CPU generator so the weights do not depend on the device.
    let mut model = CausalLm::new(&config, Device::Cpu)?;
    model.init_weights(p.seed);
    let out = job.staging.join("model");
    model.save(&out)?;
    fsx::copy_file(tokenizer_path, &out.join("tokenizer.json")).context("copying tokenizer.json")?;
    let generation = orchestrate_core::model::GenerationConfig::sampling(eos);
    fsx::write_file(&out.join("generation_config.json"), serde_json::to_string_pretty(&generation)? + "\n")?;
    eprintln!(
        "model.init: {} parameters, vocab {vocab} (tokenizer {}), eos {eos}",
        config.parameter_count(),
        tokenizer.vocab_size()
    );
    Ok(())
}
