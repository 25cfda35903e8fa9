//! What the SFT and GRPO runs share: data, prompts, state files, outputs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{bail, err, Result};
use orchestrate_core::data::rng::Stream;
use orchestrate_core::data::rows::{read_examples, LabelRow};
use orchestrate_core::model::chat::{user_message, ChatTemplate, TemplateChoice, TEMPLATE_FILES};
use orchestrate_core::model::{HfFolder, TextTokenizer};
use orchestrate_core::ops::worker::WorkerJob;
use orchestrate_core::train::metrics::{NodeCosts, TrainingMetrics};
use orchestrate_core::train::state::{read_state, write_f32_le, write_state_streamed, StateFile};
use serde_json::Value;
use tch::{Device, Kind, Tensor};

use super::adamw::AdamW;
use crate::decoder::CausalLm;

/// One example: its page (statement) joined with its label by id.
#[derive(Debug, Clone)]
pub struct Example {
    pub id: String,
    pub statement: String,
    pub label: LabelRow,
}

pub fn input_path<'a>(job: &'a WorkerJob, name: &str) -> Result<&'a PathBuf> {
    job.inputs.get(name).and_then(|v| v.first()).ok_or_else(|| err!("input '{name}' is missing"))
}

/// Joins the pages and labels of two inputs by id, in the pages' order; a
/// missing or ill-typed field fails naming the input, the row and the field.
pub fn examples(job: &WorkerJob, pages: &str, labels: &str) -> Result<Vec<Example>> {
    let joined = read_examples(input_path(job, pages)?, pages, input_path(job, labels)?, labels)?;
    Ok(joined.into_iter().map(|e| Example { id: e.page.id, statement: e.page.statement, label: e.label }).collect())
}

/// The train split's pool that `branch: sft`, `train.grpo` and the replay
/// draw from: the labels with `warmstart: false`. Empty is an error that says
/// which field selects it.
pub fn rl_pool(mut pool: Vec<Example>, labels: &str) -> Result<Vec<Example>> {
    let total = pool.len();
    pool.retain(|e| !e.label.warmstart);
    if pool.is_empty() {
        bail!(
            "{labels}: none of its {total} labels has 'warmstart: false', the field that selects the pool \
             train.grpo and `branch: sft` draw from (true selects the warm-start SFT set)"
        );
    }
    Ok(pool)
}

/// How a statement becomes prompt ids: the model folder's chat template
/// (or ChatML), the system message and the `prompt_template`.
pub struct Prompter {
    pub template: ChatTemplate,
    system: String,
    prompt_template: Option<String>,
}

impl Prompter {
    pub fn new(
        model_dir: &Path,
        choice: TemplateChoice,
        system: &str,
        prompt_template: Option<&str>,
    ) -> Result<Prompter> {
        Ok(Prompter {
            template: ChatTemplate::of_folder(model_dir, choice)?,
            system: system.to_string(),
            prompt_template: prompt_template.map(str::to_string),
        })
    }

    /// The prompt text of a statement.
    pub fn text(&self, statement: &str) -> Result<String> {
        Ok(self.template.render(&self.system, &user_message(self.prompt_template.as_deref(), statement))?)
    }

    /// The prompt's ids, refused (not truncated) over the budget.
    pub fn ids(&self, tokenizer: &TextTokenizer, statement: &str, budget: usize, id: &str) -> Result<Vec<i64>> {
        let ids = tokenizer.encode(&self.text(statement)?)?;
        if ids.len() > budget {
            bail!(
                "example {id}: the prompt is {} tokens, over the budget of {budget}; nothing is truncated",
                ids.len()
            );
        }
        Ok(ids)
    }
}

/// A permutation of 0..n that depends only on (seed, purpose, epoch).
pub fn permutation(n: usize, seed: u64, purpose: &str, epoch: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = Stream::new(seed, &format!("{purpose}/epoch/{epoch}"));
    for i in (1..n).rev() {
        let j = rng.int_inclusive(0, i as u32) as usize;
        order.swap(i, j);
    }
    order
}

pub fn load_model(dir: &Path, device: Device) -> Result<(CausalLm, TextTokenizer)> {
    let folder = HfFolder::open(dir)?;
    let tokenizer = folder.tokenizer()?;
    let model = CausalLm::load(&folder, device)?;
    Ok((model, tokenizer))
}

/// The reference policy: a strict reload of the starting weights, frozen (no
/// gradients), for the KL term.
pub fn load_reference(dir: &Path, device: Device) -> Result<CausalLm> {
    let (reference, _) = load_model(dir, device)?;
    for (_, mut t) in reference.vs.variables() {
        let _ = t.requires_grad_(false);
    }
    Ok(reference)
}

pub fn params(model: &CausalLm) -> BTreeMap<String, Tensor> {
    model.vs.variables().into_iter().collect()
}

/// Writes model, AdamW moments and `meta` as one state file, streamed: each
/// tensor goes to the file a block at a time (`write_state_streamed`), so
/// writing a state holds no copy of the model or its moments (a 0.5B model's
/// state is 5.9 GB of f32; copying it all twice before gzip ran a 24 GB
/// machine out of memory).
pub fn save_state(path: &Path, params: &BTreeMap<String, Tensor>, adam: &AdamW, meta: &Value) -> Result<()> {
    let mut shapes = Vec::with_capacity(params.len() * 3);
    let mut by_name: BTreeMap<String, &Tensor> = BTreeMap::new();
    for (name, p) in params {
        for (prefix, t) in [("model", p), ("adam_m", &adam.exp_avg[name]), ("adam_v", &adam.exp_avg_sq[name])] {
            let full = format!("{prefix}/{name}");
            shapes.push((full.clone(), t.size().iter().map(|d| *d as usize).collect()));
            by_name.insert(full, t);
        }
    }
    write_state_streamed(path, meta, &shapes, |name, out| write_tensor(by_name[name], out))?;
    Ok(())
}

/// How many values of a tensor are copied out at a time (4 MiB of f32).
const STATE_BLOCK: i64 = 1 << 20;

/// A tensor's values as little-endian f32, a block at a time.
fn write_tensor(t: &Tensor, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let flat = t.detach().to_kind(Kind::Float).contiguous().view([-1]);
    let n = flat.size()[0];
    let mut at = 0;
    while at < n {
        let len = STATE_BLOCK.min(n - at);
        let block = flat.narrow(0, at, len).to_device(Device::Cpu);
        let values = Vec::<f32>::try_from(&block).map_err(std::io::Error::other)?;
        write_f32_le(&values, out)?;
        at += len;
    }
    Ok(())
}

fn tensor_of(state: &StateFile, name: &str, device: Device) -> Result<Tensor> {
    let raw = state.tensors.get(name).ok_or_else(|| err!("the state has no tensor {name}"))?;
    let values: Vec<f32> = raw.bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let shape: Vec<i64> = raw.shape.iter().map(|d| *d as i64).collect();
    Ok(Tensor::from_slice(&values).view(shape.as_slice()).to_device(device))
}

/// Restores model parameters and AdamW moments from a state, bit for bit.
pub fn restore_state(state: &StateFile, params: &BTreeMap<String, Tensor>, adam: &mut AdamW) -> Result<()> {
    tch::no_grad(|| -> Result<()> {
        for (name, p) in params {
            let device = p.device();
            p.shallow_clone().copy_(&tensor_of(state, &format!("model/{name}"), device)?);
            adam.exp_avg.get_mut(name).expect("moments").copy_(&tensor_of(state, &format!("adam_m/{name}"), device)?);
            adam.exp_avg_sq.get_mut(name).expect("moments").copy_(&tensor_of(
                state,
                &format!("adam_v/{name}"),
                device,
            )?);
        }
        Ok(())
    })?;
    adam.step = state.meta["adam_step"].as_i64().ok_or_else(|| err!("the state has no adam_step"))?;
    Ok(())
}

pub fn read(path: &Path) -> Result<StateFile> {
    Ok(read_state(path)?)
}

/// Writes the node's outputs: the model folder (with the tokenizer), the
/// state, the metrics; and beside them what the process cost, which the
/// executor keeps in the node's record (`orchestrate_core::costs`): no output
/// holds a duration, so two runs of one key write the same bytes.
pub fn write_outputs(
    job: &WorkerJob,
    model: &CausalLm,
    model_dir: &Path,
    params: &BTreeMap<String, Tensor>,
    adam: &AdamW,
    metrics: TrainingMetrics,
    costs: NodeCosts,
) -> Result<()> {
    let out = job.staging.join("model");
    model.save(&out)?;
    // The tokenizer and what renders prompts with it travel with the weights,
    // so a trained model is evaluated with the template it was trained with.
    for extra in ["tokenizer.json", "generation_config.json"].iter().chain(&TEMPLATE_FILES) {
        let src = model_dir.join(extra);
        if src.is_file() {
            std::fs::copy(&src, out.join(extra))?;
        }
    }
    let meta = serde_json::to_value(&metrics)?;
    save_state(&job.staging.join("state"), params, adam, &meta)?;
    std::fs::write(job.staging.join("metrics"), serde_json::to_string_pretty(&meta)? + "\n")?;
    costs.write(&job.staging)?;
    Ok(())
}

/// Peak resident memory of this process in bytes (CPU runs), from /proc.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
