//! A decoder-only model's config, read straight from a Hugging Face
//! `config.json`: Qwen2, Qwen3 and Llama, told apart by `model_type`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The architectures the trainer implements. They share one decoder (RMSNorm,
/// rotary embeddings, grouped-query attention, SwiGLU) and differ in a few
/// places, each a method of [`ModelConfig`]:
///
/// | family | q/k/v bias        | o_proj bias       | MLP bias   | q/k RMSNorm | `head_dim`           |
/// |--------|-------------------|-------------------|------------|-------------|----------------------|
/// | qwen2  | always            | never             | never      | no          | hidden / heads       |
/// | qwen3  | `attention_bias`  | `attention_bias`  | never      | yes         | from the config      |
/// | llama  | `attention_bias`  | `attention_bias`  | `mlp_bias` | no          | config, else h/heads |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Qwen2,
    Qwen3,
    Llama,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::Qwen2, Family::Qwen3, Family::Llama];

    /// `model_type` as Hugging Face writes it.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Llama => "llama",
        }
    }

    /// transformers' class for it (`architectures`).
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Llama => "LlamaForCausalLM",
        }
    }

    fn from_model_type(t: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.model_type() == t)
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type())
    }
}

/// The fields of `config.json` the model needs; everything else is kept as is
/// in `extra` and written back unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Absent: as many as the attention heads (transformers' default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    #[serde(default = "d_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f64,
    /// transformers < 5 writes `rope_theta`; 5.x writes `rope_parameters.rope_theta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// Absent: false, transformers' default for all three families.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Qwen3 and Llama: bias on q/k/v/o (absent: false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    /// Llama: bias on the MLP's projections (absent: false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_bias: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<Value>,
    #[serde(default = "d_act")]
    pub hidden_act: String,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

fn d_max_pos() -> usize {
    32768
}
fn d_eps() -> f64 {
    1e-6
}
fn d_act() -> String {
    "silu".into()
}

/// Why a config cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("config.json: {0}")]
pub struct ConfigError(pub String);

/// Llama 3's rotary scaling (`rope_type: llama3`): long wavelengths are divided
/// by `factor`, short ones kept, and the band between interpolated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Rope {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

impl ModelConfig {
    /// Reads and checks a config.json.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let c: ModelConfig = serde_json::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        c.check()?;
        Ok(c)
    }

    /// The family `model_type` names (absent: qwen2, the embedded default's).
    pub fn family(&self) -> Result<Family, ConfigError> {
        match self.extra.get("model_type") {
            None => Ok(Family::Qwen2),
            Some(Value::String(t)) => Family::from_model_type(t).ok_or_else(|| {
                ConfigError(format!(
                    "model_type is '{t}'; the trainer implements {}",
                    Family::ALL.map(|f| format!("'{f}'")).join(", ")
                ))
            }),
            Some(other) => Err(ConfigError(format!("model_type is {other}, expected a string such as 'qwen2'"))),
        }
    }

    pub fn check(&self) -> Result<(), ConfigError> {
        let family = self.family()?;
        if self.hidden_act != "silu" {
            return Err(ConfigError(format!("hidden_act is '{}', only 'silu' is implemented", self.hidden_act)));
        }
        let kv = self.kv_heads();
        if self.num_attention_heads == 0 || kv == 0 {
            return Err(ConfigError("attention heads must be positive".into()));
        }
        if !self.num_attention_heads.is_multiple_of(kv) {
            return Err(ConfigError(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({kv})",
                self.num_attention_heads
            )));
        }
        if family == Family::Qwen3 && self.head_dim.is_none() {
            return Err(ConfigError("a qwen3 config names its head_dim (Qwen3-4B: 128)".into()));
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(ConfigError("hidden_size must be a multiple of num_attention_heads".into()));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(ConfigError("head_dim must be even for rotary embeddings".into()));
        }
        if family == Family::Qwen2 && self.attention_bias.is_some() {
            return Err(ConfigError(
                "attention_bias is not a qwen2 field (Qwen2's q/k/v always have a bias, its o_proj never)".into(),
            ));
        }
        if family != Family::Llama && self.mlp_bias == Some(true) {
            return Err(ConfigError(format!("mlp_bias: true is a llama field; {family} has no MLP bias")));
        }
        if self.extra.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
            return Err(ConfigError("use_sliding_window is true; sliding-window attention is not implemented".into()));
        }
        if let Some(types) = self.extra.get("layer_types").and_then(Value::as_array) {
            if let Some(t) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
                return Err(ConfigError(format!("layer_types has {t}; only 'full_attention' is implemented")));
            }
        }
        self.llama3_rope()?;
        Ok(())
    }

    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    pub fn tied(&self) -> bool {
        self.tie_word_embeddings.unwrap_or(false)
    }

    /// Whether q/k/v have a bias (qwen2: always).
    pub fn qkv_bias(&self) -> bool {
        match self.family() {
            Ok(Family::Qwen2) | Err(_) => true,
            Ok(_) => self.attention_bias.unwrap_or(false),
        }
    }

    /// Whether o_proj has a bias (qwen2: never).
    pub fn o_bias(&self) -> bool {
        match self.family() {
            Ok(Family::Qwen2) | Err(_) => false,
            Ok(_) => self.attention_bias.unwrap_or(false),
        }
    }

    pub fn mlp_has_bias(&self) -> bool {
        self.mlp_bias.unwrap_or(false)
    }

    /// Whether q and k are RMS-normalized per head before the rotation (Qwen3).
    pub fn qk_norm(&self) -> bool {
        matches!(self.family(), Ok(Family::Qwen3))
    }

    /// The rotary parameters, wherever this transformers version wrote them
    /// (`rope_parameters` in 5.x, `rope_scaling` before).
    fn rope_parameters(&self) -> Option<&serde_json::Map<String, Value>> {
        ["rope_parameters", "rope_scaling"].iter().find_map(|k| self.extra.get(*k).and_then(Value::as_object))
    }

    /// The rotary base, wherever this transformers version wrote it.
    pub fn rope_theta(&self) -> f64 {
        self.rope_theta
            .or_else(|| self.rope_parameters().and_then(|p| p.get("rope_theta")).and_then(Value::as_f64))
            .unwrap_or(10000.0)
    }

    /// Llama 3's rotary scaling, if the config asks for it; any other scaling
    /// (linear, dynamic, yarn, ...) is refused rather than ignored.
    pub fn llama3_rope(&self) -> Result<Option<Llama3Rope>, ConfigError> {
        let Some(p) = self.rope_parameters() else { return Ok(None) };
        let kind = p.get("rope_type").or_else(|| p.get("type")).and_then(Value::as_str).unwrap_or("default");
        match kind {
            "default" => Ok(None),
            "llama3" => {
                let num = |k: &str| {
                    p.get(k).and_then(Value::as_f64).ok_or_else(|| {
                        ConfigError(format!("rope_type llama3 needs a number '{k}' in its rope parameters"))
                    })
                };
                Ok(Some(Llama3Rope {
                    factor: num("factor")?,
                    low_freq_factor: num("low_freq_factor")?,
                    high_freq_factor: num("high_freq_factor")?,
                    original_max_position_embeddings: num("original_max_position_embeddings")?,
                }))
            }
            other => {
                Err(ConfigError(format!("rope_type '{other}' is not implemented (only 'default' and 'llama3' are)")))
            }
        }
    }

    /// The number of unique parameters (a tied LM head counts once). A config
    /// comes from outside: a count past 2^64 is `u64::MAX`, never wrapped.
    pub fn parameter_count(&self) -> u64 {
        self.checked_parameter_count().unwrap_or(u64::MAX)
    }

    fn checked_parameter_count(&self) -> Option<u64> {
        let n = |x: usize| u64::try_from(x).ok();
        let (h, i, v) = (n(self.hidden_size)?, n(self.intermediate_size)?, n(self.vocab_size)?);
        let head_dim = n(self.head_dim())?;
        let q_dim = n(self.num_attention_heads)?.checked_mul(head_dim)?;
        let kv_dim = n(self.kv_heads())?.checked_mul(head_dim)?;
        let qkv_bias = if self.qkv_bias() { q_dim.checked_add(kv_dim.checked_mul(2)?)? } else { 0 };
        let o_bias = if self.o_bias() { h } else { 0 };
        let attention =
            [h.checked_mul(q_dim)?, h.checked_mul(kv_dim)?.checked_mul(2)?, q_dim.checked_mul(h)?, qkv_bias, o_bias];
        let qk_norm = if self.qk_norm() { head_dim.checked_mul(2)? } else { 0 };
        let mlp_bias = if self.mlp_has_bias() { i.checked_mul(2)?.checked_add(h)? } else { 0 };
        let mlp = h.checked_mul(i)?.checked_mul(3)?.checked_add(mlp_bias)?;
        let norms = h.checked_mul(2)?;
        let layer = attention.into_iter().chain([qk_norm, mlp, norms]).try_fold(0u64, u64::checked_add)?;
        let layers = n(self.num_hidden_layers)?.checked_mul(layer)?;
        let head = if self.tied() { 0 } else { v.checked_mul(h)? };
        [v.checked_mul(h)?, layers, h, head].into_iter().try_fold(0u64, u64::checked_add)
    }

    /// The config as written to `config.json`.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("config serializes");
        text.push('\n');
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen2.5-0.5B-Instruct's config.json (revision 7ae557604adf67be50417f59c2c2f167def9a775).
    pub const QWEN25_05B: &str = r#"{"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
      "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
      "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
      "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
      "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
      "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936}"#;

    #[test]
    fn the_05b_config_has_the_protocols_parameter_count() {
        let c = ModelConfig::from_json(QWEN25_05B).unwrap();
        assert_eq!(c.parameter_count(), 494_032_768);
        assert_eq!(c.head_dim(), 64);
        assert_eq!(c.rope_theta(), 1_000_000.0);
    }

    /// A config from outside with dimensions whose product passes 2^64: its
    /// count saturates (so it can never equal what weight files hold, and
    /// `model.import` refuses it) instead of overflowing, which panicked in a
    /// debug build and wrapped around to any number in release.
    #[test]
    fn a_config_whose_count_passes_2_to_the_64_saturates_never_wraps() {
        let huge = QWEN25_05B
            .replace("\"hidden_size\": 896", "\"hidden_size\": 60129542144")
            .replace("\"intermediate_size\": 4864", "\"intermediate_size\": 8589934592");
        let c = ModelConfig::from_json(&huge).unwrap();
        assert_eq!(c.parameter_count(), u64::MAX);
    }

    #[test]
    fn unknown_fields_survive_a_round_trip() {
        let c = ModelConfig::from_json(QWEN25_05B).unwrap();
        let back: Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(back["sliding_window"], 32768);
        assert_eq!(back["torch_dtype"], "bfloat16");
    }

    #[test]
    fn a_bad_config_says_why() {
        let text = QWEN25_05B.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
        let err = ModelConfig::from_json(&text).unwrap_err().to_string();
        assert!(err.contains("multiple of num_key_value_heads"), "{err}");
        let text = QWEN25_05B.replace("\"model_type\": \"qwen2\"", "\"model_type\": \"gpt2\"");
        let err = ModelConfig::from_json(&text).unwrap_err().to_string();
        assert!(err.contains("'gpt2'") && err.contains("'qwen3'") && err.contains("'llama'"), "{err}");
        let text = QWEN25_05B.replace("\"use_sliding_window\": false", "\"use_sliding_window\": true");
        assert!(ModelConfig::from_json(&text).unwrap_err().to_string().contains("sliding"));
    }
}
