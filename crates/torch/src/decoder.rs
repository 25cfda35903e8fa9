//! The decoder of Qwen2, Qwen3 and Llama in tch, following Hugging Face's eager
//! `Qwen2ForCausalLM`, `Qwen3ForCausalLM` and `LlamaForCausalLM`: RMSNorm
//! computed in float, rotary embeddings (rotate-half) from explicit position
//! ids (Llama 3's scaled frequencies when the config asks), grouped-query
//! attention with a float32 softmax, SwiGLU MLP, and the LM head tied to the
//! embeddings when the config says so. Where the families differ (biases,
//! Qwen3's per-head q/k RMSNorm, `head_dim`) the config says which
//! ([`orchestrate_core::model::config::Family`]). Weight names follow from the
//! structure (`model.layers.{i}.self_attn.q_proj`).

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{bail, err, Context, Result};
use orchestrate_core::model::config::Llama3Rope;
use orchestrate_core::model::{HfFolder, ModelConfig};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

/// The value masked attention scores are set to (as transformers does: finfo.min,
/// not -inf, so a fully masked row gives a uniform distribution, not NaN).
const MASKED: f64 = f32::MIN as f64;

struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn new(p: nn::Path, size: i64, eps: f64) -> Self {
        RmsNorm { weight: p.var("weight", &[size], nn::Init::Const(1.0)), eps }
    }
    fn forward(&self, x: &Tensor) -> Tensor {
        let xf = x.to_kind(Kind::Float);
        let variance = xf.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
        let normed = xf * (variance + self.eps).rsqrt();
        &self.weight * normed.to_kind(x.kind())
    }
}

fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size()[x.dim() - 1] / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    Tensor::cat(&[-x2, x1], -1)
}

/// Refuses a config whose FP32 weights alone pass the memory this process
/// may use (RAM and swap from `/proc/meminfo`, or the container's cgroup
/// limit where that is lower): libtorch's allocator would fail, and tch
/// panics on that, or the kernel's OOM killer would end the process while the
/// weights are written. Where the memory cannot be read, nothing is checked.
fn check_fits_in_memory(config: &ModelConfig) -> Result<()> {
    let Some(memory) = machine_memory_bytes() else { return Ok(()) };
    let count = config.parameter_count();
    let bytes = count.saturating_mul(4);
    if bytes > memory {
        bail!(
            "the config implies {count} parameters, {:.1} GiB in FP32, more than the {:.1} GiB of memory this \
             process may use (RAM and swap, within its cgroup's limit)",
            bytes as f64 / (1u64 << 30) as f64,
            memory as f64 / (1u64 << 30) as f64
        );
    }
    Ok(())
}

/// MemTotal plus SwapTotal, in bytes, or less where the cgroup this process
/// runs in limits its memory (v2's `memory.max`, v1's
/// `memory.limit_in_bytes`, each where `/proc/self/cgroup` places it or at the
/// mount's top as a container sees it); `None` off Linux or when unreadable.
fn machine_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find_map(|l| l.strip_prefix(name))?;
        line.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?.checked_mul(1024)
    };
    let machine = field("MemTotal:")?.saturating_add(field("SwapTotal:").unwrap_or(0));
    let mut limits = Vec::new();
    for line in std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default().lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if controllers.is_empty() {
            limits.push(format!("/sys/fs/cgroup{path}/memory.max"));
            limits.push("/sys/fs/cgroup/memory.max".to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            limits.push(format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"));
            limits.push("/sys/fs/cgroup/memory/memory.limit_in_bytes".to_string());
        }
    }
    // "max" (no limit) reads as no number; v1 says "no limit" with a huge one.
    let lowest = limits.iter().filter_map(|f| std::fs::read_to_string(f).ok()?.trim().parse::<u64>().ok()).min();
    Some(lowest.map_or(machine, |limit| machine.min(limit)))
}

/// cos and sin of shape (batch, 1, seq, head_dim) for explicit positions.
pub struct Rotary {
    inv_freq: Tensor,
}

impl Rotary {
    fn new(head_dim: i64, theta: f64, llama3: Option<Llama3Rope>, device: Device) -> Self {
        let exponents =
            Tensor::arange_start_step(0, head_dim, 2, (Kind::Int64, device)).to_kind(Kind::Float) / head_dim as f64;
        let inv_freq = (Tensor::from(theta).to_kind(Kind::Float).to_device(device).pow(&exponents)).reciprocal();
        let inv_freq = match llama3 {
            Some(r) => llama3_inv_freq(&inv_freq, r),
            None => inv_freq,
        };
        Rotary { inv_freq }
    }

    fn cos_sin(&self, positions: &Tensor) -> (Tensor, Tensor) {
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * self.inv_freq.view([1, 1, -1]);
        let emb = Tensor::cat(&[&freqs, &freqs], -1);
        (emb.cos().unsqueeze(1), emb.sin().unsqueeze(1))
    }
}

/// transformers' `_compute_llama3_parameters`: wavelengths above
/// `original / low_freq_factor` are divided by `factor`, those below
/// `original / high_freq_factor` kept, and the band between interpolated.
fn llama3_inv_freq(inv_freq: &Tensor, r: Llama3Rope) -> Tensor {
    let low_wavelen = r.original_max_position_embeddings / r.low_freq_factor;
    let high_wavelen = r.original_max_position_embeddings / r.high_freq_factor;
    let wavelen = inv_freq.reciprocal() * (2.0 * std::f64::consts::PI);
    // tch's `a.where_self(cond, b)` is torch.where(cond, a, b).
    let scaled = (inv_freq / r.factor).where_self(&wavelen.gt(low_wavelen), inv_freq);
    let smooth = (wavelen.reciprocal() * r.original_max_position_embeddings - r.low_freq_factor)
        / (r.high_freq_factor - r.low_freq_factor);
    let smoothed = (-&smooth + 1.0) * &scaled / r.factor + &smooth * &scaled;
    let medium = wavelen.ge(high_wavelen).logical_and(&wavelen.le(low_wavelen));
    smoothed.where_self(&medium, &scaled)
}

struct Attention {
    /// Qwen3's per-head RMSNorm of q and k, before the rotation.
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    q_proj: nn::Linear,
    k_proj: nn::Linear,
    v_proj: nn::Linear,
    o_proj: nn::Linear,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

impl Attention {
    fn new(p: nn::Path, c: &ModelConfig) -> Self {
        let (h, hd) = (c.hidden_size as i64, c.head_dim() as i64);
        let (nh, nkv) = (c.num_attention_heads as i64, c.kv_heads() as i64);
        let qkv = nn::LinearConfig { bias: c.qkv_bias(), ..Default::default() };
        let o = nn::LinearConfig { bias: c.o_bias(), ..Default::default() };
        let norm = |name: &str| c.qk_norm().then(|| RmsNorm::new(&p / name, hd, c.rms_norm_eps));
        Attention {
            q_norm: norm("q_norm"),
            k_norm: norm("k_norm"),
            q_proj: nn::linear(&p / "q_proj", h, nh * hd, qkv),
            k_proj: nn::linear(&p / "k_proj", h, nkv * hd, qkv),
            v_proj: nn::linear(&p / "v_proj", h, nkv * hd, qkv),
            o_proj: nn::linear(&p / "o_proj", nh * hd, h, o),
            heads: nh,
            kv_heads: nkv,
            head_dim: hd,
        }
    }

    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
        cache: &mut Option<(Tensor, Tensor)>,
    ) -> Tensor {
        let (b, t) = (x.size()[0], x.size()[1]);
        let normed = |norm: &Option<RmsNorm>, y: Tensor| match norm {
            Some(n) => n.forward(&y),
            None => y,
        };
        let q = normed(&self.q_norm, self.q_proj.forward(x).view([b, t, self.heads, self.head_dim])).transpose(1, 2);
        let k = normed(&self.k_norm, self.k_proj.forward(x).view([b, t, self.kv_heads, self.head_dim])).transpose(1, 2);
        let v = self.v_proj.forward(x).view([b, t, self.kv_heads, self.head_dim]).transpose(1, 2);
        let q = &q * cos + rotate_half(&q) * sin;
        let k = &k * cos + rotate_half(&k) * sin;
        let (k, v) = match cache.take() {
            Some((pk, pv)) => (Tensor::cat(&[pk, k], 2), Tensor::cat(&[pv, v], 2)),
            None => (k, v),
        };
        *cache = Some((k.shallow_clone(), v.shallow_clone()));
        // Grouped-query attention without copying K and V: the query heads that
        // share a key/value head are stacked along the query axis instead
        // (head h = kv * groups + g, the order of transformers' repeat_kv).
        let groups = self.heads / self.kv_heads;
        let tk = k.size()[2];
        let qg = q.reshape([b, self.kv_heads, groups * t, self.head_dim]);
        let scores =
            qg.matmul(&k.transpose(-2, -1)).view([b, self.heads, t, tk]) * (1.0 / (self.head_dim as f64).sqrt()) + mask;
        let probs = scores.softmax(-1, Kind::Float).to_kind(q.kind());
        let y = probs
            .view([b, self.kv_heads, groups * t, tk])
            .matmul(&v)
            .view([b, self.heads, t, self.head_dim])
            .transpose(1, 2)
            .contiguous()
            .view([b, t, self.heads * self.head_dim]);
        self.o_proj.forward(&y)
    }
}

struct Mlp {
    gate_proj: nn::Linear,
    up_proj: nn::Linear,
    down_proj: nn::Linear,
}

impl Mlp {
    fn new(p: nn::Path, c: &ModelConfig) -> Self {
        let (h, i) = (c.hidden_size as i64, c.intermediate_size as i64);
        let cfg = nn::LinearConfig { bias: c.mlp_has_bias(), ..Default::default() };
        Mlp {
            gate_proj: nn::linear(&p / "gate_proj", h, i, cfg),
            up_proj: nn::linear(&p / "up_proj", h, i, cfg),
            down_proj: nn::linear(&p / "down_proj", i, h, cfg),
        }
    }
    fn forward(&self, x: &Tensor) -> Tensor {
        self.down_proj.forward(&(self.gate_proj.forward(x).silu() * self.up_proj.forward(x)))
    }
}

struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

/// Per-layer key/value cache for incremental decoding.
pub type KvCache = Vec<Option<(Tensor, Tensor)>>;

/// A loaded causal LM of one of the [`orchestrate_core::model::config::Family`] architectures.
pub struct CausalLm {
    pub config: ModelConfig,
    pub vs: nn::VarStore,
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Option<Tensor>,
    rotary: Rotary,
}

impl CausalLm {
    /// A model with freshly created (default-initialised) weights.
    pub fn new(config: &ModelConfig, device: Device) -> Result<Self> {
        config.check()?;
        if device == Device::Cpu {
            check_fits_in_memory(config)?;
        }
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let m = &root / "model";
        let (v, h) = (config.vocab_size as i64, config.hidden_size as i64);
        let embed_tokens = (&m / "embed_tokens").var("weight", &[v, h], nn::Init::Randn { mean: 0.0, stdev: 0.02 });
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let p = &m / "layers" / i;
                DecoderLayer {
                    input_layernorm: RmsNorm::new(&p / "input_layernorm", h, config.rms_norm_eps),
                    self_attn: Attention::new(&p / "self_attn", config),
                    post_attention_layernorm: RmsNorm::new(&p / "post_attention_layernorm", h, config.rms_norm_eps),
                    mlp: Mlp::new(&p / "mlp", config),
                }
            })
            .collect();
        let norm = RmsNorm::new(&m / "norm", h, config.rms_norm_eps);
        let lm_head = (!config.tied())
            .then(|| (&root / "lm_head").var("weight", &[v, h], nn::Init::Randn { mean: 0.0, stdev: 0.02 }));
        let rotary = Rotary::new(config.head_dim() as i64, config.rope_theta(), config.llama3_rope()?, device);
        Ok(CausalLm { config: config.clone(), vs, embed_tokens, layers, norm, lm_head, rotary })
    }

    /// Re-initialises every weight as transformers does for these families (normal(0, 0.02)
    /// for matrices, zero biases, unit norms), from a seed, on the CPU generator.
    pub fn init_weights(&mut self, seed: u64) {
        tch::manual_seed(seed as i64);
        let mut vars: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        tch::no_grad(|| {
            for (name, mut t) in vars {
                let fresh = if name.ends_with("norm.weight") {
                    Tensor::ones(t.size(), (Kind::Float, Device::Cpu))
                } else if name.ends_with(".bias") {
                    Tensor::zeros(t.size(), (Kind::Float, Device::Cpu))
                } else {
                    Tensor::randn(t.size(), (Kind::Float, Device::Cpu)) * 0.02
                };
                t.copy_(&fresh);
            }
        });
    }

    /// Loads a Hugging Face folder (single or sharded safetensors), strictly:
    /// every weight must be present with its shape, and no unknown weight may be left over.
    pub fn load(folder: &HfFolder, device: Device) -> Result<Self> {
        let config = folder.config()?;
        // Every weight is allocated from the config before one is read, so a
        // config that implies more than the files hold (edited by hand, or
        // from outside) is refused first: what is allocated is bounded by the
        // files' own sizes. (More than the config implies is allowed here: a
        // tied model may store its head; a weight left over is refused below.)
        let stored = folder.stored_parameter_count()?;
        if config.parameter_count() > stored {
            bail!(
                "{}: config.json implies {} parameters, but the weight files hold {stored} parameters",
                folder.dir.display(),
                config.parameter_count()
            );
        }
        let model = CausalLm::new(&config, device)?;
        let mut vars = model.vs.variables();
        let mut seen = std::collections::BTreeSet::new();
        for file in folder.weight_files()? {
            let tensors = Tensor::read_safetensors(&file).with_context(|| format!("reading {}", file.display()))?;
            for (name, t) in tensors {
                if name == "lm_head.weight" && config.tied() {
                    continue; // tied: the embedding is the head
                }
                let Some(var) = vars.get_mut(&name) else {
                    bail!(
                        "{}: unexpected weight '{name}' for this {} config (see its model_type and biases)",
                        file.display(),
                        config.family()?
                    );
                };
                if var.size() != t.size() {
                    bail!(
                        "{}: weight '{name}' has shape {:?}, the config implies {:?}",
                        file.display(),
                        t.size(),
                        var.size()
                    );
                }
                tch::no_grad(|| var.copy_(&t.to_kind(Kind::Float)));
                seen.insert(name);
            }
        }
        let missing: Vec<&String> = vars.keys().filter(|n| !seen.contains(*n)).collect();
        if !missing.is_empty() {
            bail!("{}: missing weights: {:?}", folder.dir.display(), missing);
        }
        Ok(model)
    }

    /// Writes config.json and model.safetensors (FP32, sorted names) in HF layout.
    pub fn save(&self, dir: &Path) -> Result<()> {
        // A real folder: one planted as a link (in staging) is refused, never written into.
        orchestrate_core::store::fsx::own_dir(dir)
            .map_err(|e| crate::error::Error::Msg(format!("model folder: {e}")))?;
        let mut vars: BTreeMap<String, Tensor> = self.vs.variables().into_iter().collect();
        let tensors: Vec<(String, Tensor)> =
            vars.iter_mut().map(|(k, v)| (k.clone(), v.detach().to_device(Device::Cpu).contiguous())).collect();
        Tensor::write_safetensors(&tensors, dir.join("model.safetensors")).context("writing model.safetensors")?;
        let mut config = self.config.clone();
        config.extra.insert("torch_dtype".into(), "float32".into());
        let family = config.family()?;
        config.extra.entry("model_type").or_insert_with(|| family.model_type().into());
        config.extra.entry("architectures").or_insert_with(|| vec![family.architecture()].into());
        orchestrate_core::store::fsx::write_file(&dir.join("config.json"), config.to_json())?;
        Ok(())
    }

    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// Logits at every position: (batch, seq, vocab). `positions` are the
    /// rotary positions of `input_ids`; `mask` is additive, (batch, 1, seq, keys).
    pub fn forward(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        self.forward_logits(input_ids, positions, mask, cache, Keep::All)
    }

    /// Logits at chosen positions only: `rows` (batch, k) are position indices
    /// into each row, and the result is (batch, k, vocab). Training needs the
    /// response positions alone, and the LM head over a 151,936-token vocabulary
    /// is most of the logits' memory: at Qwen2.5-0.5B's shapes, 96-token prompts
    /// and 64-token responses, this keeps 0.6 GB of logits (and their gradient)
    /// instead of 1.6 GB.
    pub fn forward_rows(&self, input_ids: &Tensor, positions: &Tensor, mask: &Tensor, rows: &Tensor) -> Tensor {
        self.forward_logits(input_ids, positions, mask, None, Keep::Rows(rows))
    }

    /// Logits at the last position only, (batch, 1, vocab): generation needs no
    /// more, and the LM head is the largest matmul of a step (as transformers'
    /// `logits_to_keep=1`).
    pub fn forward_last(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        self.forward_logits(input_ids, positions, mask, cache, Keep::Last)
    }

    fn forward_logits(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        cache: Option<&mut KvCache>,
        keep: Keep<'_>,
    ) -> Tensor {
        let mut local: KvCache = Vec::new();
        let cache = match cache {
            Some(c) => c,
            None => &mut local,
        };
        if cache.len() != self.layers.len() {
            cache.clear();
            cache.resize_with(self.layers.len(), || None);
        }
        let (cos, sin) = self.rotary.cos_sin(positions);
        let mut h = self.embed_tokens.embedding_for(input_ids);
        for (layer, slot) in self.layers.iter().zip(cache.iter_mut()) {
            let a = layer.self_attn.forward(&layer.input_layernorm.forward(&h), &cos, &sin, mask, slot);
            h = h + a;
            let m = layer.mlp.forward(&layer.post_attention_layernorm.forward(&h));
            h = h + m;
        }
        let h = match keep {
            Keep::All => h,
            Keep::Last => h.narrow(1, h.size()[1] - 1, 1),
            Keep::Rows(rows) => {
                let (b, k, d) = (rows.size()[0], rows.size()[1], h.size()[2]);
                h.gather(1, &rows.view([b, k, 1]).expand([b, k, d], false), false)
            }
        };
        let h = self.norm.forward(&h);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        h.matmul(&head.tr())
    }
}

/// Which positions get logits.
enum Keep<'a> {
    All,
    Last,
    Rows(&'a Tensor),
}

trait EmbeddingFor {
    fn embedding_for(&self, ids: &Tensor) -> Tensor;
}

impl EmbeddingFor for Tensor {
    fn embedding_for(&self, ids: &Tensor) -> Tensor {
        Tensor::embedding(self, ids, -1, false, false)
    }
}

/// The additive mask for `query_len` new queries after `past` cached keys:
/// causal, and keys where `key_valid` (batch, past + query_len) is 0 masked.
pub fn attention_mask(key_valid: &Tensor, query_len: i64) -> Tensor {
    let device = key_valid.device();
    let (b, keys) = (key_valid.size()[0], key_valid.size()[1]);
    if query_len == 1 {
        // One new token sees every valid key: only padding is masked.
        return ((key_valid.to_kind(Kind::Float) - 1.0) * (-MASKED)).view([b, 1, 1, keys]);
    }
    let past = keys - query_len;
    let q = Tensor::arange(query_len, (Kind::Int64, device)).view([query_len, 1]) + past;
    let k = Tensor::arange(keys, (Kind::Int64, device)).view([1, keys]);
    let causal = k.le_tensor(&q); // (q, k)
    let allowed =
        causal.view([1, 1, query_len, keys]).logical_and(&key_valid.to_kind(Kind::Bool).view([b, 1, 1, keys]));
    Tensor::zeros([b, 1, query_len, keys], (Kind::Float, device)).masked_fill(&allowed.logical_not(), MASKED)
}

/// Errors from a model folder, for the CLI.
pub fn load_folder(dir: &Path, device: Device) -> Result<(CausalLm, orchestrate_core::model::TextTokenizer)> {
    let folder = HfFolder::open(dir)?;
    let tokenizer = folder.tokenizer()?;
    let model = CausalLm::load(&folder, device)?;
    if (tokenizer.vocab_size() as usize) > model.config.vocab_size {
        return Err(err!(
            "{}: the tokenizer has {} tokens but the model's vocab_size is {}",
            dir.display(),
            tokenizer.vocab_size(),
            model.config.vocab_size
        ));
    }
    Ok((model, tokenizer))
}
