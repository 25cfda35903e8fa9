//! Verifiers: turn a response into a reward, with the reason for every zero.
//!
//! Each verifier has a name and a protocol hash (blake3 of its name, version and
//! rule text), so a run records exactly which rules scored it and the guard can
//! refuse a reward from an unregistered or changed verifier. No generated text
//! is ever executed or evaluated.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use super::json_strict::{parse_one, JsonValue, ParseError};
use super::{solve, Problem};

/// How generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// The model emitted its end-of-sequence token.
    Eos,
    /// The token budget ran out first.
    Length,
}

/// A response as the verifier sees it: decoded text (without the final EOS),
/// how it ended, and whether every generated id decoded.
#[derive(Debug, Clone, Copy)]
pub struct Response<'a> {
    pub text: &'a str,
    pub finish: FinishReason,
    pub tokenization_valid: bool,
}

/// Why a response earned no reward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// A generated id the tokenizer cannot decode.
    UndecodableToken,
    /// Stopped at the token budget, even if its start is correct.
    CompletionWithoutEos,
    /// Longer than 256 characters.
    Oversized,
    /// Wrapped in Markdown code fences.
    MarkdownFence,
    NotJson,
    /// `NaN`, `Infinity` or `-Infinity`.
    NonFiniteNumber,
    DuplicateKey,
    /// Two JSON values (e.g. two objects).
    MultipleValues,
    /// Text after the JSON value.
    TrailingText,
    /// Valid JSON, but not an object.
    NotAnObject,
    MissingKey,
    ExtraKey,
    /// An object or array as the value.
    NestedValue,
    BoolValue,
    /// Float syntax, even for an integral value (`12.0`, `1e1`).
    FloatValue,
    StringValue,
    NullValue,
    NegativeValue,
    /// An integer above 300.
    OutOfRange,
    /// Well-formed, but not the solver's answer.
    WrongAnswer,
    /// No number anywhere in the text (GSM8K-style).
    NoNumber,
}

/// A verifier's decision about one response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// 1 for a correct response, else 0.
    pub reward: u8,
    /// Whether the response was well-formed (a wrong but well-formed answer is valid).
    pub valid: bool,
    pub value: Option<Value>,
    pub expected: Value,
    pub reason: Option<Reason>,
}

/// The problem handed to a verifier is malformed (a caller's error, not the model's).
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid problem for verifier '{verifier}': {message}")]
pub struct ProblemError {
    pub verifier: &'static str,
    pub message: String,
}

/// A registered way of scoring responses.
pub trait Verifier: Send + Sync {
    fn name(&self) -> &'static str;
    fn version(&self) -> u32;
    /// The rules in words; part of the protocol hash.
    fn definition(&self) -> &'static str;
    fn verify(&self, problem: &Value, response: &Response<'_>) -> Result<Verdict, ProblemError>;

    /// blake3 of name, version and definition.
    fn protocol_hash(&self) -> String {
        let mut h = blake3::Hasher::new();
        h.update(b"orchestrate.verifier.v1\0");
        h.update(self.name().as_bytes());
        h.update(b"\0");
        h.update(&self.version().to_le_bytes());
        h.update(self.definition().as_bytes());
        h.finalize().to_hex().to_string()
    }
}

fn zero(expected: Value, reason: Reason) -> Verdict {
    Verdict { reward: 0, valid: false, value: None, expected, reason: Some(reason) }
}

/// The StockArithmetic-v1 verifier.
pub struct StockArithmetic;

/// The protocol's verifier: the default of `eval.score` and `train.grpo`.
pub const PROTOCOL_VERIFIER: &str = "stock_arithmetic_v1";

/// Longest accepted response, in characters.
pub const MAX_RESPONSE_CHARS: usize = 256;
/// Largest accepted `final_stock`.
pub const MAX_FINAL_STOCK: i128 = 300;

impl Verifier for StockArithmetic {
    fn name(&self) -> &'static str {
        "stock_arithmetic_v1"
    }
    fn version(&self) -> u32 {
        1
    }
    fn definition(&self) -> &'static str {
        "Reward 1 only for a response that ended with EOS, whose generated ids all decode, of at most 256 \
         characters, that is exactly one JSON object (JSON whitespace around it allowed; no Markdown fences, \
         no second value, no trailing text; NaN/Infinity rejected) with exactly one key, final_stock, no \
         duplicate keys at any depth, whose value uses integer syntax (no fraction or exponent; not a bool, \
         string, null, object or array) in 0..=300, and equals the exact solver's final stock for the \
         structured problem {initial, deliveries[2], withdrawals[2]}. Everything else is 0 with a reason."
    }

    fn verify(&self, problem: &Value, response: &Response<'_>) -> Result<Verdict, ProblemError> {
        let bad = |message: String| ProblemError { verifier: "stock_arithmetic_v1", message };
        let p: Problem = serde_json::from_value(problem.clone()).map_err(|e| bad(e.to_string()))?;
        let expected = Value::from(solve(&p).map_err(|e| bad(e.to_string()))?);
        if !response.tokenization_valid {
            return Ok(zero(expected, Reason::UndecodableToken));
        }
        if response.finish != FinishReason::Eos {
            return Ok(zero(expected, Reason::CompletionWithoutEos));
        }
        if response.text.chars().count() > MAX_RESPONSE_CHARS {
            return Ok(zero(expected, Reason::Oversized));
        }
        if response.text.trim_start().starts_with("```") {
            return Ok(zero(expected, Reason::MarkdownFence));
        }
        let parsed = match parse_one(response.text) {
            Ok(v) => v,
            Err(e) => {
                let reason = match e {
                    ParseError::Syntax(_) => Reason::NotJson,
                    ParseError::NonFinite => Reason::NonFiniteNumber,
                    ParseError::DuplicateKey(_) => Reason::DuplicateKey,
                    ParseError::MultipleValues => Reason::MultipleValues,
                    ParseError::TrailingText => Reason::TrailingText,
                };
                return Ok(zero(expected, reason));
            }
        };
        let JsonValue::Object(pairs) = parsed else { return Ok(zero(expected, Reason::NotAnObject)) };
        if pairs.iter().any(|(k, _)| k != "final_stock") {
            return Ok(zero(expected, Reason::ExtraKey));
        }
        let Some((_, value)) = pairs.first() else { return Ok(zero(expected, Reason::MissingKey)) };
        let reason = match value {
            JsonValue::Object(_) | JsonValue::Array(_) => Reason::NestedValue,
            JsonValue::Bool(_) => Reason::BoolValue,
            JsonValue::String(_) => Reason::StringValue,
            JsonValue::Null => Reason::NullValue,
            JsonValue::Number(n) => match n.integer {
                None if n.text.contains(['.', 'e', 'E']) => Reason::FloatValue,
                None => Reason::OutOfRange, // integer syntax too large for i128
                Some(v) if v < 0 => Reason::NegativeValue,
                Some(v) if v > MAX_FINAL_STOCK => Reason::OutOfRange,
                Some(v) => {
                    let value = Value::from(v as i64);
                    let correct = value == expected;
                    return Ok(Verdict {
                        reward: u8::from(correct),
                        valid: true,
                        value: Some(value),
                        expected,
                        reason: (!correct).then_some(Reason::WrongAnswer),
                    });
                }
            },
        };
        Ok(zero(expected, reason))
    }
}

/// A task-agnostic adapter in the GSM8K style: the last number in the text
/// against the gold answer (the text after `####` when present).
pub struct Gsm8kLastNumber;

/// A decimal number in canonical form: no commas, no leading `+`, trailing
/// fractional zeros removed, `-0` as `0`.
fn canonical_number(raw: &str) -> Option<String> {
    let s: String = raw.chars().filter(|c| *c != ',' && !c.is_whitespace() && *c != '$').collect();
    let (neg, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest.to_string()),
        None => (false, s.strip_prefix('+').unwrap_or(&s).to_string()),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((&digits, ""));
    if int.is_empty() && frac.is_empty()
        || !int.chars().all(|c| c.is_ascii_digit())
        || !frac.chars().all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let int = int.trim_start_matches('0');
    let int = if int.is_empty() { "0" } else { int };
    let frac = frac.trim_end_matches('0');
    let body = if frac.is_empty() { int.to_string() } else { format!("{int}.{frac}") };
    Some(if neg && body != "0" { format!("-{body}") } else { body })
}

/// The last number written in a text, as written.
fn last_number(text: &str) -> Option<&str> {
    let b = text.as_bytes();
    let mut last = None;
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let mut start = i;
            if start > 0 && b[start - 1] == b'-' {
                start -= 1;
            }
            while i < b.len()
                && (b[i].is_ascii_digit() || (b[i] == b',' && i + 1 < b.len() && b[i + 1].is_ascii_digit()))
            {
                i += 1;
            }
            if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
                i += 1;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
            }
            last = Some(&text[start..i]);
        } else {
            i += 1;
        }
    }
    last
}

impl Verifier for Gsm8kLastNumber {
    fn name(&self) -> &'static str {
        "gsm8k_last_number"
    }
    fn version(&self) -> u32 {
        1
    }
    fn definition(&self) -> &'static str {
        "Reward 1 only for a response that ended with EOS, whose generated ids all decode, and whose last \
         number (optional '-', digits with optional thousands commas, optional decimal part) equals the gold \
         answer numerically after canonicalization (commas removed, trailing fractional zeros removed, -0 = 0). \
         The gold answer is problem.answer (a number, or a string whose text after '####' is the number)."
    }

    fn verify(&self, problem: &Value, response: &Response<'_>) -> Result<Verdict, ProblemError> {
        let bad = |message: &str| ProblemError { verifier: "gsm8k_last_number", message: message.to_string() };
        let gold_raw = match problem.get("answer") {
            Some(Value::Number(n)) => n.to_string(),
            Some(Value::String(s)) => s.rsplit("####").next().unwrap_or(s).trim().to_string(),
            _ => return Err(bad("expected {\"answer\": <number or string>}")),
        };
        let gold = canonical_number(&gold_raw).ok_or_else(|| bad("the gold answer is not a number"))?;
        let expected = Value::String(gold.clone());
        if !response.tokenization_valid {
            return Ok(zero(expected, Reason::UndecodableToken));
        }
        if response.finish != FinishReason::Eos {
            return Ok(zero(expected, Reason::CompletionWithoutEos));
        }
        let Some(found) = last_number(response.text).and_then(canonical_number) else {
            return Ok(zero(expected, Reason::NoNumber));
        };
        let correct = found == gold;
        Ok(Verdict {
            reward: u8::from(correct),
            valid: true,
            value: Some(Value::String(found)),
            expected,
            reason: (!correct).then_some(Reason::WrongAnswer),
        })
    }
}

/// The verifiers a run may use, by name.
#[derive(Clone)]
pub struct VerifierRegistry {
    verifiers: BTreeMap<&'static str, Arc<dyn Verifier>>,
    /// Rewards registered for one run (a weighted sum of terms, programs
    /// among them): name → protocol hash.
    rewards: BTreeMap<String, String>,
}

impl VerifierRegistry {
    pub fn builtin() -> Self {
        let mut verifiers: BTreeMap<&'static str, Arc<dyn Verifier>> = BTreeMap::new();
        for v in [Arc::new(StockArithmetic) as Arc<dyn Verifier>, Arc::new(Gsm8kLastNumber)] {
            verifiers.insert(v.name(), v);
        }
        VerifierRegistry { verifiers, rewards: BTreeMap::new() }
    }

    /// This registry with one more reward (name, protocol hash) registered.
    pub fn with_reward(mut self, name: &str, protocol_hash: &str) -> Self {
        if self.get(name).is_none() {
            self.rewards.insert(name.to_string(), protocol_hash.to_string());
        }
        self
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Verifier>> {
        self.verifiers.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Verifier>> {
        self.verifiers.values()
    }

    /// Whether a (name, protocol hash) pair is registered here.
    pub fn is_registered(&self, name: &str, protocol_hash: &str) -> bool {
        self.get(name).is_some_and(|v| v.protocol_hash() == protocol_hash)
            || self.rewards.get(name).is_some_and(|h| h == protocol_hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn protocol_hashes_differ_between_verifiers_and_are_stable() {
        let r = VerifierRegistry::builtin();
        let a = r.get("stock_arithmetic_v1").unwrap().protocol_hash();
        let b = r.get("gsm8k_last_number").unwrap().protocol_hash();
        assert_ne!(a, b);
        assert_eq!(a, StockArithmetic.protocol_hash());
        assert!(r.is_registered("stock_arithmetic_v1", &a));
        assert!(!r.is_registered("stock_arithmetic_v1", &b));
    }

    fn gsm(text: &str, answer: Value) -> Verdict {
        Gsm8kLastNumber
            .verify(
                &json!({ "answer": answer }),
                &Response { text, finish: FinishReason::Eos, tokenization_valid: true },
            )
            .unwrap()
    }

    #[test]
    fn gsm8k_takes_the_last_number_and_compares_canonically() {
        assert_eq!(gsm("She has 3 apples, then 5, so 1,250 total.", json!("steps...\n#### 1250")).reward, 1);
        assert_eq!(gsm("The answer is 12.50", json!(12.5)).reward, 1);
        assert_eq!(gsm("The answer is -7", json!("#### -7")).reward, 1);
        assert_eq!(gsm("The answer is 7", json!("#### -7")).reason, Some(Reason::WrongAnswer));
        assert_eq!(gsm("First 42 then 41", json!(42)).reason, Some(Reason::WrongAnswer));
        assert_eq!(gsm("no digits here", json!(1)).reason, Some(Reason::NoNumber));
        assert_eq!(gsm("x = 3.", json!(3)).reward, 1, "a sentence's full stop is not a decimal point");
    }

    #[test]
    fn gsm8k_requires_eos_and_a_numeric_gold() {
        let v = Gsm8kLastNumber
            .verify(
                &json!({"answer": 3}),
                &Response { text: "3", finish: FinishReason::Length, tokenization_valid: true },
            )
            .unwrap();
        assert_eq!(v.reason, Some(Reason::CompletionWithoutEos));
        assert!(Gsm8kLastNumber
            .verify(
                &json!({"answer": "many"}),
                &Response { text: "3", finish: FinishReason::Eos, tokenization_valid: true }
            )
            .is_err());
    }
}
