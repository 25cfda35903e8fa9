//! Rewards: a weighted sum of terms, each a registered verifier or the
//! researcher's own program (TRL's `reward_funcs` with `reward_weights`).
//!
//! A term's program speaks JSON lines on its stdin and stdout ([`program`]):
//! one [`RewardRequest`] per response, one [`RewardReply`] back. Whatever it
//! does wrong (crashes, hangs, replies with something that is not a reply, a
//! reward that is not a finite number, a reply over its bound) fails the node
//! with an error naming the term, the program and the row, never a silent 0.
//!
//! Each term has an identity (a verifier's protocol hash; a program's digest
//! of its command, its files and its interpreter's version) and the sum has
//! one over all terms and weights ([`RewardFunction::protocol_hash`]): what a
//! rollout's envelope names and the guard checks against the registry.

pub mod program;
pub mod python;

use std::path::Path;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::data::rows::LabelRow;
use crate::data::verifier::{FinishReason, Response, Verifier, VerifierRegistry};
pub use program::{interpreter_version, ProgramSpec, RewardProgram};
pub(crate) use python::python_module_files;

/// One term of a reward, as a spec writes it: exactly one of `verifier`
/// (a registered verifier, `orchestrate verifier list`) or `command` (a
/// program speaking JSON lines; see docs/rewards.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewardTerm {
    /// The term's name: its metrics are `rewards/<name>/mean` and `/std`.
    pub name: String,
    /// Its weight in the sum (TRL's `reward_weights`).
    #[serde(default = "d_weight")]
    pub weight: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verifier: Option<String>,
    /// The program and its arguments, run in the spec's folder
    /// (`[python3, rewards/format.py]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// More files the program reads (its modules, tables): in the key by
    /// content, as the command's own script is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// Seconds the program has for each reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
}

fn d_weight() -> f64 {
    1.0
}

impl RewardTerm {
    /// The term of a plain `verifier:` param.
    pub fn of_verifier(name: &str) -> RewardTerm {
        RewardTerm {
            name: name.to_string(),
            weight: 1.0,
            verifier: Some(name.to_string()),
            command: None,
            files: Vec::new(),
            timeout_s: None,
        }
    }

    /// The term's program, if it is one.
    pub fn program(&self) -> Option<ProgramSpec> {
        self.command.as_ref().map(|command| ProgramSpec {
            command: command.clone(),
            files: self.files.clone(),
            timeout_s: self.timeout_s.unwrap_or(program::DEFAULT_TIMEOUT_S),
        })
    }

    /// What is wrong with the term, as (field, message).
    pub fn check(&self) -> Result<(), (String, String)> {
        let bad = |field: &str, m: String| Err((field.to_string(), m));
        if self.name.is_empty() || !self.name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)) {
            return bad("name", format!("'{}': expected letters, digits, '_', '-' or '.'", self.name));
        }
        if !self.weight.is_finite() {
            return bad("weight", format!("{}: expected a finite number", self.weight));
        }
        match (&self.verifier, &self.command) {
            (Some(_), Some(_)) | (None, None) => {
                return bad(
                    "verifier",
                    "give exactly one of 'verifier' (a registered verifier) or 'command' (a program)".into(),
                )
            }
            (Some(v), None) => {
                let registry = VerifierRegistry::builtin();
                if registry.get(v).is_none() {
                    return bad(
                        "verifier",
                        format!(
                            "no verifier '{v}'{} (see `orchestrate verifier list`; a program of your own is `command:`)",
                            crate::suggest::did_you_mean(v, registry.iter().map(|v| v.name()))
                        ),
                    );
                }
                if !self.files.is_empty() || self.timeout_s.is_some() {
                    return bad("files", "'files' and 'timeout_s' belong to a 'command' term".into());
                }
            }
            (None, Some(_)) => {
                if let Err((field, m)) = self.program().expect("a command term").check() {
                    return bad(&field, m);
                }
            }
        }
        Ok(())
    }
}

/// Checks a list of terms: each, and that names are unique.
pub fn check_terms(terms: &[RewardTerm]) -> Result<(), (Vec<String>, String)> {
    if terms.is_empty() {
        return Err((vec![], "expected at least one term".into()));
    }
    for (i, t) in terms.iter().enumerate() {
        t.check().map_err(|(f, m)| (vec![i.to_string(), f], m))?;
        if terms[..i].iter().any(|o| o.name == t.name) {
            return Err((vec![i.to_string(), "name".into()], format!("'{}' names two terms", t.name)));
        }
    }
    Ok(())
}

/// The files of the terms' programs (relative to the spec's folder): what
/// the node's key holds by content.
pub fn program_files(terms: &[RewardTerm], spec_dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = terms.iter().filter_map(RewardTerm::program).flat_map(|p| p.files(spec_dir)).collect();
    files.sort();
    files.dedup();
    files
}

/// The interpreters of the terms' programs (`python3`), whose versions are in the key.
pub fn program_interpreters(terms: &[RewardTerm]) -> Vec<String> {
    let mut out: Vec<String> =
        terms.iter().filter_map(RewardTerm::program).filter_map(|p| p.interpreter().map(str::to_string)).collect();
    out.sort();
    out.dedup();
    out
}

/// What one request carries: the problem's label, the response as the
/// verifiers see it, and where it came from (for errors and the program's logs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardRequest {
    /// The problem's id (its label's).
    pub id: String,
    /// The rollout id (train.grpo), or the response's index (eval.score).
    pub row: u64,
    /// The problem's label, every field (`problem`, `target`, `population`, ...).
    pub label: LabelRow,
    /// The decoded response, without its final end-of-sequence token.
    pub response: String,
    pub finish: FinishReason,
    /// Whether every generated id decoded.
    pub tokenization_valid: bool,
}

/// A program's reply to one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardReply {
    /// A finite number.
    pub reward: f64,
    /// Whether the response was well-formed (a wrong but well-formed answer is valid).
    pub valid: bool,
    /// Why the reward is what it is, for the counts of reasons (optional).
    #[serde(default)]
    pub reason: Option<String>,
}

/// One term's score of one response.
#[derive(Debug, Clone, PartialEq)]
pub struct TermScore {
    pub reward: f64,
    pub valid: bool,
    pub reason: Option<String>,
}

/// A response's reward: the weighted sum and each term's score (in term order).
#[derive(Debug, Clone, PartialEq)]
pub struct RowScore {
    pub total: f64,
    pub terms: Vec<TermScore>,
}

/// Why a reward could not be computed: the node fails with it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct RewardError(pub String);

enum Scorer {
    Verifier(Arc<dyn Verifier>),
    Program(RewardProgram),
}

struct Term {
    name: String,
    weight: f64,
    scorer: Scorer,
    /// The verifier's protocol hash, or the program's digest.
    identity: String,
}

/// A started reward: its verifiers and running programs, scoring responses.
pub struct RewardFunction {
    terms: Vec<Term>,
    /// True for a lone verifier term with weight 1 (the `verifier:` param):
    /// its envelope names the verifier itself, as before terms existed.
    plain: bool,
}

impl RewardFunction {
    /// Starts every term (each program in `spec_dir`).
    pub fn start(terms: &[RewardTerm], spec_dir: &Path) -> Result<RewardFunction, RewardError> {
        check_terms(terms).map_err(|(path, m)| RewardError(format!("reward.{}: {m}", path.join("."))))?;
        let registry = VerifierRegistry::builtin();
        let mut started = Vec::with_capacity(terms.len());
        for t in terms {
            let (scorer, identity) = match (&t.verifier, t.program()) {
                (Some(v), _) => {
                    let v = registry.get(v).cloned().ok_or_else(|| RewardError(format!("no verifier '{v}'")))?;
                    let hash = v.protocol_hash();
                    (Scorer::Verifier(v), hash)
                }
                (None, Some(spec)) => {
                    let p = RewardProgram::start(&t.name, &spec, spec_dir)?;
                    let digest = p.digest().to_string();
                    (Scorer::Program(p), digest)
                }
                (None, None) => unreachable!("checked: a term is a verifier or a command"),
            };
            started.push(Term { name: t.name.clone(), weight: t.weight, scorer, identity });
        }
        let plain = terms.len() == 1 && terms[0].verifier.is_some() && terms[0].weight == 1.0;
        Ok(RewardFunction { terms: started, plain })
    }

    pub fn names(&self) -> Vec<String> {
        self.terms.iter().map(|t| t.name.clone()).collect()
    }

    /// The name a rollout's envelope gives its reward: the verifier's for a
    /// plain verifier, `program:<command>` for a lone program of weight 1
    /// (eval.score's), else `reward:<term>+<term>...`.
    pub fn name(&self) -> String {
        match (&self.terms[0].scorer, self.plain, self.terms.len()) {
            (Scorer::Verifier(v), true, _) => v.name().to_string(),
            (Scorer::Program(p), _, 1) if self.terms[0].weight == 1.0 && self.terms[0].name == "program" => {
                format!("program:{}", p.command())
            }
            _ => format!("reward:{}", self.names().join("+")),
        }
    }

    /// The identity of the whole reward: the verifier's protocol hash for a
    /// plain verifier, else blake3 over every term's name, weight and identity.
    pub fn protocol_hash(&self) -> String {
        if self.plain {
            return self.terms[0].identity.clone();
        }
        let mut h = blake3::Hasher::new();
        h.update(b"orchestrate.reward.v1\0");
        for t in &self.terms {
            h.update(t.name.as_bytes());
            h.update(b"\0");
            h.update(&t.weight.to_le_bytes());
            h.update(t.identity.as_bytes());
            h.update(b"\0");
        }
        h.finalize().to_hex().to_string()
    }

    /// The registry the guard checks rewards against: the built-in
    /// verifiers, and this reward.
    pub fn registry(&self) -> VerifierRegistry {
        VerifierRegistry::builtin().with_reward(&self.name(), &self.protocol_hash())
    }

    /// Scores one response with every term.
    pub fn score(&mut self, request: &RewardRequest) -> Result<RowScore, RewardError> {
        let mut total = 0.0;
        let mut scores = Vec::with_capacity(self.terms.len());
        for t in &mut self.terms {
            let s = match &mut t.scorer {
                Scorer::Verifier(v) => {
                    let response = Response {
                        text: &request.response,
                        finish: request.finish,
                        tokenization_valid: request.tokenization_valid,
                    };
                    let verdict = v.verify(&request.label.problem, &response).map_err(|e| {
                        RewardError(format!("reward '{}': row {} (problem {}): {e}", t.name, request.row, request.id))
                    })?;
                    TermScore {
                        reward: f64::from(verdict.reward),
                        valid: verdict.valid,
                        reason: verdict
                            .reason
                            .and_then(|r| serde_json::to_value(r).ok().and_then(|v| v.as_str().map(str::to_string))),
                    }
                }
                Scorer::Program(p) => {
                    let reply = p.call(request)?;
                    TermScore { reward: reply.reward, valid: reply.valid, reason: reply.reason }
                }
            };
            total += t.weight * s.reward;
            scores.push(s);
        }
        Ok(RowScore { total, terms: scores })
    }

    /// Seconds spent waiting for the programs' replies so far.
    pub fn program_seconds(&self) -> f64 {
        self.terms
            .iter()
            .map(|t| match &t.scorer {
                Scorer::Program(p) => p.seconds(),
                Scorer::Verifier(_) => 0.0,
            })
            .sum()
    }

    /// Ends every program: closes its stdin, waits a moment for it to exit,
    /// then kills its process group. An exit status other than 0 after every
    /// reply arrived is an error too (a program that fails at its end).
    pub fn finish(self) -> Result<(), RewardError> {
        for t in self.terms {
            if let Scorer::Program(p) = t.scorer {
                p.finish()?;
            }
        }
        Ok(())
    }
}

/// Mean and sample standard deviation per term over some rows (TRL's
/// `rewards/<name>/mean` and `/std`), and the count of invalid responses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TermStats {
    pub mean: f64,
    /// Sample standard deviation (n − 1, as torch's `std`); undefined for one row.
    pub std: Option<f64>,
    pub invalid: usize,
}

/// Each term's statistics over `rows`, by name.
pub fn term_stats(names: &[String], rows: &[RowScore]) -> std::collections::BTreeMap<String, TermStats> {
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let values: Vec<f64> = rows.iter().map(|r| r.terms[i].reward).collect();
            let n = values.len() as f64;
            let mean = values.iter().sum::<f64>() / n;
            let std =
                (values.len() > 1).then(|| (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt());
            let invalid = rows.iter().filter(|r| !r.terms[i].valid).count();
            (name.clone(), TermStats { mean, std, invalid })
        })
        .collect()
}

#[cfg(test)]
mod tests;
