//! What the SFT and GRPO runs share: data, prompts, state files, outputs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{bail, err, Error, Result};
use orchestrate_core::data::rng::Stream;
use orchestrate_core::data::rows::{read_examples, LabelRow};
use orchestrate_core::model::chat::{user_message, ChatTemplate, TemplateChoice, TEMPLATE_FILES};
use orchestrate_core::model::{HfFolder, TextTokenizer};
use orchestrate_core::ops::worker::WorkerJob;
use orchestrate_core::store::fsx;
use orchestrate_core::train::metrics::TrainingMetrics;
use orchestrate_core::train::state::{write_f32_le, write_state_streamed, StateReader};
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
pub fn save_state(path: &Path, params: &BTreeMap<String, Tensor>, adam: &AdamW, meta: &TrainingMetrics) -> Result<()> {
    let by_name = state_tensors(params, adam)?;
    let shapes: Vec<(String, Vec<usize>)> =
        by_name.iter().map(|(name, t)| (name.clone(), t.size().iter().map(|d| *d as usize).collect())).collect();
    write_state_streamed(path, meta, &shapes, |name, out| write_tensor(by_name[name], out))?;
    Ok(())
}

/// Every tensor a state holds, by its name there: the model's parameters and
/// AdamW's two moments (`model/NAME`, `adam_m/NAME`, `adam_v/NAME`), the one
/// naming both writing and restoring a state use.
fn state_tensors<'t>(params: &'t BTreeMap<String, Tensor>, adam: &'t AdamW) -> Result<BTreeMap<String, &'t Tensor>> {
    let mut out = BTreeMap::new();
    for (name, p) in params {
        let (Some(m), Some(v)) = (adam.exp_avg.get(name), adam.exp_avg_sq.get(name)) else {
            bail!("AdamW holds no moments for parameter {name}")
        };
        for (prefix, t) in [("model", p), ("adam_m", m), ("adam_v", v)] {
            out.insert(format!("{prefix}/{name}"), t);
        }
    }
    Ok(out)
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

/// Restores model parameters and AdamW moments from a state file, streamed.
/// The state's metrics are read first and handed to `accept`, which refuses a
/// state of another run or kind before any tensor is read; then each tensor
/// goes from the gzip stream straight into its parameter or moment, a block at
/// a time, bit for bit, so restoring holds no copy of the state (a 0.5B
/// model's is 5.9 GB). A state missing a tensor, holding one this model does
/// not have, or one of another shape or dtype is refused, naming it.
pub fn restore_state<T>(
    path: &Path,
    what: &str,
    params: &BTreeMap<String, Tensor>,
    adam: &mut AdamW,
    accept: impl FnOnce(TrainingMetrics) -> Result<T>,
) -> Result<T> {
    let reader = StateReader::open(path)?;
    let metrics = TrainingMetrics::from_meta(reader.meta(), what).map_err(|e| err!("{e}"))?;
    let adam_step = match &metrics {
        TrainingMetrics::Sft(m) => m.adam_step,
        TrainingMetrics::Grpo(m) => m.adam_step,
    };
    let accepted = accept(metrics)?;
    let targets = state_tensors(params, adam)?;
    // Every tensor is matched against the model from the header, before any
    // is read: a state that does not fit leaves the model as it was.
    let heads = reader.heads();
    for head in heads {
        let Some(target) = targets.get(&head.name) else {
            return Err(Error::Input(format!(
                "{}: the state holds {}, which this model does not have",
                path.display(),
                head.name
            )));
        };
        let shape: Vec<usize> = target.size().iter().map(|d| *d as usize).collect();
        if head.dtype != "F32" || head.shape != shape {
            return Err(Error::Input(format!(
                "{}: tensor {} is {} {:?} in the state, F32 {shape:?} in the model",
                path.display(),
                head.name,
                head.dtype,
                head.shape
            )));
        }
    }
    if let Some(missing) = targets.keys().find(|name| !heads.iter().any(|h| &h.name == *name)) {
        return Err(Error::Input(format!("{}: the state has no tensor {missing}", path.display())));
    }
    tch::no_grad(|| reader.read_tensors(|head, bytes| read_tensor(targets[&head.name], bytes)))?;
    adam.step = adam_step;
    Ok(accepted)
}

/// Fills a tensor with little-endian f32 values read from `bytes`, a block at
/// a time (the tensor may live on a GPU).
fn read_tensor(target: &Tensor, bytes: &mut dyn std::io::Read) -> std::io::Result<()> {
    let flat = target.view([-1]);
    let n = flat.size()[0];
    let mut block = vec![0u8; (STATE_BLOCK.min(n).max(0) as usize) * 4];
    let mut at = 0;
    while at < n {
        let len = STATE_BLOCK.min(n - at);
        let raw = &mut block[..len as usize * 4];
        bytes.read_exact(raw)?;
        let values: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        flat.narrow(0, at, len).copy_(&Tensor::from_slice(&values));
        at += len;
    }
    Ok(())
}

/// Writes the node's outputs: the model folder (with the tokenizer), the
/// state, the metrics. What the process cost is not among them: the op returns
/// it in its `WorkerResult` and the executor keeps it in the node's record
/// (`orchestrate_core::costs`), so no output holds a duration and two runs of
/// one key write the same bytes.
pub fn write_outputs(
    job: &WorkerJob,
    model: &CausalLm,
    model_dir: &Path,
    params: &BTreeMap<String, Tensor>,
    adam: &AdamW,
    metrics: TrainingMetrics,
) -> Result<()> {
    let out = job.staging.join("model");
    model.save(&out)?;
    // The tokenizer and what renders prompts with it travel with the weights,
    // so a trained model is evaluated with the template it was trained with.
    for extra in ["tokenizer.json", "generation_config.json"].iter().chain(&TEMPLATE_FILES) {
        let src = model_dir.join(extra);
        if src.is_file() {
            fsx::copy_file(&src, &out.join(extra))?;
        }
    }
    save_state(&job.staging.join("state"), params, adam, &metrics)?;
    fsx::write_file(&job.staging.join("metrics"), metrics.to_json_pretty()? + "\n")?;
    Ok(())
}

/// Peak resident memory of this process in bytes (CPU runs), from /proc.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::train::adamw::AdamWConfig;
    use orchestrate_core::train::metrics::{Scheduler, SftIdentity, SftMetrics};

    /// Parameters of the given shapes and AdamW moments, all random from `seed`.
    fn trained(shapes: &[(&str, &[i64])], seed: i64) -> (BTreeMap<String, Tensor>, AdamW) {
        tch::manual_seed(seed);
        let params: BTreeMap<String, Tensor> =
            shapes.iter().map(|(n, s)| (n.to_string(), Tensor::randn(*s, (Kind::Float, Device::Cpu)))).collect();
        let mut adam = AdamW::new(AdamWConfig::new(0.01), &params);
        for t in adam.exp_avg.values_mut().chain(adam.exp_avg_sq.values_mut()) {
            let _ = t.normal_(0.0, 1.0);
        }
        adam.step = 7;
        (params, adam)
    }

    /// A state's metrics for tests (an SFT run's).
    pub(crate) fn meta(adam_step: i64) -> TrainingMetrics {
        let p = serde_json::from_value(serde_json::json!({"branch": "warmstart", "epochs": 1})).unwrap();
        let m = SftMetrics {
            identity: SftIdentity::new(&p, "digest".into(), 4),
            next_epoch: 1,
            complete: false,
            updates: 3,
            adam_step,
            scheduler: Scheduler { next_update: 3, total: 6 },
            history: Vec::new(),
            validation_history: Vec::new(),
            final_model_digest: "digest".into(),
            costs: None,
        };
        TrainingMetrics::Sft(m)
    }

    fn same(a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>) -> bool {
        a.len() == b.len() && a.iter().all(|(n, t)| b.get(n).is_some_and(|u| t.equal(u)))
    }

    /// (Issue #36 item 5.) A state restores into the model's own tensors,
    /// read from the stream a block at a time (one tensor spans two blocks),
    /// bit for bit, AdamW's step included; a state its caller refuses leaves
    /// the model untouched; a state of another shape, lacking a tensor or
    /// holding one the model does not have is refused, naming the tensor.
    #[test]
    fn a_state_restores_bit_for_bit_into_the_model_and_a_mismatched_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let shapes: &[(&str, &[i64])] = &[("embed", &[2, 600_000]), ("norm", &[5]), ("w", &[3, 4])];
        let (saved, saved_adam) = trained(shapes, 1);
        let path = dir.path().join("state");
        save_state(&path, &saved, &saved_adam, &meta(7)).unwrap();

        let (params, mut adam) = trained(shapes, 2);
        let before: BTreeMap<String, Tensor> = params.iter().map(|(n, t)| (n.clone(), t.copy())).collect();
        let e = restore_state(&path, "the test state", &params, &mut adam, |_| -> Result<()> { bail!("not this run") })
            .unwrap_err();
        assert!(e.to_string().contains("not this run"), "{e}");
        assert!(same(&params, &before), "a refused state changed the model");

        let kind = restore_state(&path, "the test state", &params, &mut adam, |m| Ok(m.kind())).unwrap();
        assert_eq!(kind, "sft");
        assert!(same(&params, &saved), "the model is not the saved one, bit for bit");
        assert!(same(&adam.exp_avg, &saved_adam.exp_avg) && same(&adam.exp_avg_sq, &saved_adam.exp_avg_sq));
        assert_eq!(adam.step, 7);

        let refused = |shapes: &[(&str, &[i64])]| {
            let (params, mut adam) = trained(shapes, 3);
            let before: BTreeMap<String, Tensor> = params.iter().map(|(n, t)| (n.clone(), t.copy())).collect();
            let e = restore_state(&path, "the test state", &params, &mut adam, |_| Ok(())).unwrap_err();
            assert!(same(&params, &before), "a state that does not fit changed the model");
            e.to_string()
        };
        let e = refused(&[("embed", &[2, 600_000]), ("norm", &[5]), ("w", &[4, 3])]);
        assert!(e.contains("w") && e.contains("[3, 4]") && e.contains("[4, 3]"), "{e}");
        let e = refused(&[("embed", &[2, 600_000]), ("norm", &[5]), ("w", &[3, 4]), ("x", &[2])]);
        assert!(e.contains("has no tensor adam_m/x"), "{e}");
        let e = refused(&[("embed", &[2, 600_000]), ("w", &[3, 4])]);
        assert!(e.contains("adam_m/norm") && e.contains("does not have"), "{e}");
    }
}
