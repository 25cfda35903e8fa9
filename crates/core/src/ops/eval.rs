//! Evaluation: `eval.generate` (no labels: one greedy response per test problem
//! and `draws` sampled ones, with seeds common to every policy) and
//! `eval.score` (with labels: per-population success, JSON validity, no-EOS,
//! lengths). Every output is kept, invalid ones included.

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::worker::{WorkerOp, WorkerTask};
use super::{read_jsonl, required, InputDecl, Op, OpError, OutputDecl, Role, RunContext};
use crate::data::rows::{labels_by_id, read_labels, LabelRow};
use crate::data::verifier::{FinishReason, VerifierRegistry, PROTOCOL_VERIFIER};
use crate::model::DEFAULT_SYSTEM;

fn failed(e: impl std::fmt::Display) -> OpError {
    OpError::Failed(e.to_string())
}

/// Params of `eval.generate`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalGenerateParams {
    /// Sampled draws per problem (besides the greedy one).
    #[serde(default = "d_draws")]
    pub draws: usize,
    /// The sampling seed; with the draw's rollout id it fixes every sample, the
    /// same for every policy evaluated with it.
    #[serde(default = "d_eval_seed")]
    pub seed: u64,
    #[serde(default = "d_tokens")]
    pub max_new_tokens: usize,
    #[serde(default = "d_prompt")]
    pub max_prompt_tokens: usize,
    /// Rows generated together.
    #[serde(default = "d_batch")]
    #[schemars(range(min = 1))]
    pub batch_size: usize,
    /// Evaluate only the first N problems (small budgets for tests); all by default.
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default = "d_system")]
    pub system: String,
    /// The chat template prompts are rendered with: `model` (the model
    /// folder's own, `tokenizer_config.json`'s `chat_template`; the built-in
    /// ChatML when it ships none) or `chatml`.
    #[serde(default, skip_serializing_if = "crate::model::chat::TemplateChoice::is_default")]
    pub chat_template: crate::model::chat::TemplateChoice,
    /// The user message around each statement, `{prompt}` standing for it
    /// (`"Solve step by step: {prompt}"`). Absent: the statement itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_template: Option<String>,
    /// A name for the evaluated policy (handy as a matrix axis). A label only:
    /// the worker never reads it, so it stays out of the resolved params and
    /// the key (two evaluations of one model under two names are one).
    #[serde(default, skip_serializing)]
    pub policy: Option<String>,
}

fn d_draws() -> usize {
    4
}
fn d_eval_seed() -> u64 {
    20_000
}
fn d_tokens() -> usize {
    crate::model::MAX_RESPONSE_TOKENS
}
fn d_prompt() -> usize {
    crate::model::MAX_PROMPT_TOKENS
}
fn d_batch() -> usize {
    100
}
fn d_system() -> String {
    DEFAULT_SYSTEM.to_string()
}

/// One evaluated response, as `eval.generate` writes it (JSON lines).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalResponse {
    pub id: String,
    /// The page's population; `null` for a page without one (tallied in ALL only).
    #[serde(deserialize_with = "required")]
    pub population: Option<String>,
    /// "greedy" or "sample".
    pub mode: String,
    pub draw: usize,
    pub rollout_id: Option<u64>,
    pub ids: Vec<i64>,
    pub text: String,
    pub finish: FinishReason,
    pub undecodable: Vec<u32>,
}

/// What `eval.generate` writes as `summary` beside its responses, and `eval.score` reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSummary {
    pub problems: usize,
    pub draws: usize,
    /// Only in summaries written before eval.generate v2: the generation's
    /// seconds are now in the node's record ([`crate::costs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_seconds: Option<f64>,
    /// Only before eval.generate v2, as `generation_seconds` (`null` there
    /// where the OS did not report it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    pub device: String,
}

impl EvalSummary {
    /// The costs a summary written before eval.generate v2 holds.
    pub fn legacy_costs(&self) -> Option<crate::costs::NodeCosts> {
        let process = self.generation_seconds.map(|seconds| crate::costs::RunCosts {
            seconds,
            optimization_seconds: None,
            peak_rss_bytes: self.peak_rss_bytes,
        });
        crate::costs::NodeCosts::legacy(process.as_ref(), BTreeMap::new())
    }
}

/// One population's tally in one mode, as `eval.score` writes it. Rates are
/// `null` (with `undefined_because`) for an empty population, never 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PopulationScore {
    pub responses: usize,
    pub problems: usize,
    pub correct: usize,
    #[serde(deserialize_with = "required")]
    pub success_rate: Option<f64>,
    pub valid_json: usize,
    #[serde(deserialize_with = "required")]
    pub json_validity: Option<f64>,
    pub without_eos: usize,
    #[serde(deserialize_with = "required")]
    pub mean_response_tokens: Option<f64>,
    #[serde(deserialize_with = "required")]
    pub undefined_because: Option<String>,
    pub zero_reasons: BTreeMap<String, usize>,
}

/// One mode's tallies by population: `ALL` (every problem) and each
/// population the labels name (`ID50` and `OOD100` for StockArithmetic, the
/// `population` field of imported data). Written as an object keyed by name.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct ModeScores(BTreeMap<String, PopulationScore>);

impl<'de> Deserialize<'de> for ModeScores {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, PopulationScore>::deserialize(d)?;
        if !map.contains_key(ALL) {
            return Err(serde::de::Error::missing_field("ALL"));
        }
        Ok(ModeScores(map))
    }
}

/// The population of every problem.
pub const ALL: &str = crate::data::rows::ALL_POPULATION;

impl ModeScores {
    /// A population by its name in specs and tables (`ALL`, `ID50`, …).
    pub fn population(&self, name: &str) -> Option<&PopulationScore> {
        self.0.get(name)
    }

    /// `ALL`'s tally.
    pub fn all(&self) -> &PopulationScore {
        self.0.get(ALL).expect("ModeScores always has ALL")
    }

    /// The populations, `ALL` first, then the others by name.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(ALL).chain(self.0.keys().map(String::as_str).filter(|n| *n != ALL))
    }
}

/// The verifier that scored an evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifierRef {
    pub name: String,
    pub protocol_hash: String,
}

/// What `eval.score` writes as `results`, and `results.table`, `analysis.arms`
/// and the report read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalResults {
    pub verifier: VerifierRef,
    pub greedy: ModeScores,
    pub sample: ModeScores,
    /// What each reported metric means, in words.
    pub metrics: BTreeMap<String, String>,
    /// Only in results written before eval.score v5, copied from the
    /// evaluation's summary; the costs are in eval.generate's record now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_seconds: Option<f64>,
    /// Only before eval.score v5, as `generation_seconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    pub device: String,
    /// The evaluated policy's name, when the spec gave one.
    #[serde(deserialize_with = "required")]
    pub policy: Option<String>,
    /// Each problem's greedy outcome, by problem id: what a paired comparison
    /// of two policies on the same problems needs.
    pub greedy_problems: BTreeMap<String, ProblemOutcome>,
    /// Each problem's sampled draws, scored, by problem id: what a paired
    /// per-draw comparison needs. `None` in results written before version 3,
    /// which did not keep them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_problems: Option<BTreeMap<String, DrawOutcomes>>,
}

/// One problem's sampled responses, scored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrawOutcomes {
    pub population: String,
    pub draws: usize,
    pub correct: usize,
}

/// One problem's greedy response, scored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProblemOutcome {
    pub population: String,
    pub correct: bool,
}

impl EvalResults {
    /// Reads an `eval.score` result; a missing or ill-typed field is an error
    /// naming the file and the field.
    pub fn read(path: &std::path::Path) -> Result<Self, OpError> {
        Ok(crate::canonical::read_typed(path)?)
    }
}

/// `eval.generate`.
pub struct EvalGenerate;

impl Op for EvalGenerate {
    fn name(&self) -> &'static str {
        WorkerOp::EvalGenerate.name()
    }
    /// 2: the summary keeps no seconds and no memory peak (they are in the
    ///    node's record, so two runs of one key write the same bytes).
    fn version(&self) -> u32 {
        2
    }
    fn summary(&self) -> &'static str {
        "greedy and sampled responses of a policy to test problems; no labels (runs in the worker)"
    }
    type Params = EvalGenerateParams;
    fn check(&self, p: &Self::Params) -> Result<(), super::ParamError> {
        super::check_prompt_template(&p.prompt_template)?;
        use super::Range::AtLeastOne;
        super::check_ranges(&[
            ("max_new_tokens", p.max_new_tokens as f64, AtLeastOne),
            ("max_prompt_tokens", p.max_prompt_tokens as f64, AtLeastOne),
        ])
    }
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<InputDecl>> {
        Some(vec![
            InputDecl::required("model", "the policy's model folder"),
            InputDecl::required("pages", "the pages to answer (data:pages.test)"),
        ])
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        vec![OutputDecl::file("responses"), OutputDecl::file("summary")]
    }
    fn numerical(&self) -> bool {
        true
    }
    fn role(&self, _params: &Self::Params) -> Role {
        Role::Inference
    }
    fn run(&self, params: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        super::worker::run_in_worker(WorkerTask::EvalGenerate(params.clone()), ctx)
    }
}

/// Params of `eval.score`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScoreParams {
    /// A name for the evaluated policy (recorded).
    #[serde(default)]
    pub policy: Option<String>,
    /// The verifier that scores each response against its label's `problem`
    /// (`orchestrate verifier list`): `stock_arithmetic_v1` (the protocol's),
    /// or `gsm8k_last_number` for answer-style data (`dataset.import`).
    #[serde(default = "d_verifier", skip_serializing_if = "is_protocol_verifier")]
    pub verifier: String,
    /// A program of your own that scores each response instead of a verifier
    /// (docs/rewards.md): it replies `reward` 1 for a correct response, 0 for
    /// a wrong one; `valid` and `reason` are counted as a verifier's are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<crate::reward::ProgramSpec>,
}

impl ScoreParams {
    /// The one term that scores: the program, or the verifier.
    pub fn term(&self) -> crate::reward::RewardTerm {
        match &self.program {
            Some(p) => crate::reward::RewardTerm {
                name: "program".into(),
                weight: 1.0,
                verifier: None,
                command: Some(p.command.clone()),
                files: p.files.clone(),
                timeout_s: Some(p.timeout_s),
            },
            None => crate::reward::RewardTerm::of_verifier(&self.verifier),
        }
    }
}

fn d_verifier() -> String {
    PROTOCOL_VERIFIER.to_string()
}

/// Left out of the resolved params (so of the key) when it is the default:
/// keys written before the param existed stay the same.
fn is_protocol_verifier(v: &str) -> bool {
    v == PROTOCOL_VERIFIER
}

/// `eval.score`.
pub struct EvalScore;

impl Op for EvalScore {
    fn name(&self) -> &'static str {
        "eval.score"
    }
    /// 2: each problem's greedy outcome (`greedy_problems`).
    /// 3: each problem's draws and correct ones (`sample_problems`).
    /// 4: the populations are the labels' (a split without OOD100 has no
    ///    OOD100 entry) and the labels are read as the typed rows.
    /// 5: the results keep no seconds and no memory peak (see eval.generate v2).
    fn version(&self) -> u32 {
        5
    }
    fn summary(&self) -> &'static str {
        "per-population success, JSON validity, no-EOS and lengths of evaluated responses"
    }
    type Params = ScoreParams;
    fn check(&self, p: &Self::Params) -> Result<(), super::ParamError> {
        super::train::known_verifier(&p.verifier)?;
        if let Some(program) = &p.program {
            if p.verifier != PROTOCOL_VERIFIER {
                return Err(super::ParamError {
                    path: vec!["program".into()],
                    message: "give either 'verifier' or 'program'".into(),
                    unknown_key: false,
                });
            }
            program.check().map_err(|(field, message)| super::ParamError {
                path: vec!["program".into(), field],
                message,
                unknown_key: false,
            })?;
        }
        Ok(())
    }
    fn file_deps(&self, p: &Self::Params, spec_dir: &std::path::Path) -> Vec<String> {
        crate::reward::program_files(&[p.term()], spec_dir)
    }
    fn interpreters(&self, p: &Self::Params) -> Vec<String> {
        crate::reward::program_interpreters(&[p.term()])
    }
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<InputDecl>> {
        Some(vec![
            InputDecl::required("responses", "eval.generate's responses"),
            InputDecl::required("summary", "eval.generate's summary (problems, draws, device)"),
            InputDecl::required("labels", "the labels of the same split (data:labels.test)"),
        ])
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        vec![OutputDecl::file("results")]
    }
    fn role(&self, _params: &Self::Params) -> Role {
        Role::Scoring
    }
    fn run(&self, params: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let responses: Vec<EvalResponse> = read_jsonl(ctx.input_path("responses")?)?;
        let summary: EvalSummary = crate::canonical::read_typed(ctx.input_path("summary")?)?;
        let labels = labels_by_id(read_labels(ctx.input_path("labels")?, "labels").map_err(failed)?);
        let mut reward = crate::reward::RewardFunction::start(&[params.term()], ctx.spec_dir).map_err(failed)?;
        let results = score_with(&responses, &labels, &summary, &mut reward, params.policy.clone())?;
        reward.finish().map_err(failed)?;
        let text = serde_json::to_string_pretty(&results).map_err(failed)? + "\n";
        ctx.write_output("results", text)
    }
}

#[derive(Default)]
struct Tally {
    responses: usize,
    problems: BTreeSet<String>,
    correct: usize,
    valid: usize,
    without_eos: usize,
    tokens: usize,
    reasons: BTreeMap<String, usize>,
}

impl Tally {
    fn score(&self) -> PopulationScore {
        let rate = |n: usize| (self.responses > 0).then(|| n as f64 / self.responses as f64);
        PopulationScore {
            responses: self.responses,
            problems: self.problems.len(),
            correct: self.correct,
            success_rate: rate(self.correct),
            valid_json: self.valid,
            json_validity: rate(self.valid),
            without_eos: self.without_eos,
            mean_response_tokens: (self.responses > 0).then(|| self.tokens as f64 / self.responses as f64),
            undefined_because: (self.responses == 0).then(|| "no responses in this population".to_string()),
            zero_reasons: self.reasons.clone(),
        }
    }
}

/// Scores evaluated responses against labels, per population and mode.
pub fn score(
    responses: &[EvalResponse],
    labels: &BTreeMap<String, LabelRow>,
    summary: &EvalSummary,
    verifier: &str,
    policy: Option<String>,
) -> Result<EvalResults, OpError> {
    if VerifierRegistry::builtin().get(verifier).is_none() {
        return Err(failed(format!("no verifier '{verifier}'")));
    }
    let mut reward = crate::reward::RewardFunction::start(
        &[crate::reward::RewardTerm::of_verifier(verifier)],
        std::path::Path::new("."),
    )
    .map_err(failed)?;
    score_with(responses, labels, summary, &mut reward, policy)
}

/// Scores evaluated responses with one reward term (a verifier, or a program
/// whose reward must be 1 or 0), per population and mode.
pub fn score_with(
    responses: &[EvalResponse],
    labels: &BTreeMap<String, LabelRow>,
    summary: &EvalSummary,
    reward: &mut crate::reward::RewardFunction,
    policy: Option<String>,
) -> Result<EvalResults, OpError> {
    // Every population the labels name is reported, answered or not (an
    // empty one is undefined, never 0).
    let populations: BTreeSet<&str> =
        std::iter::once(ALL).chain(labels.values().filter_map(|l| l.population.as_deref())).collect();
    let mut tallies: BTreeMap<(String, String), Tally> = BTreeMap::new();
    let mut greedy_problems = BTreeMap::new();
    let mut sample_problems: BTreeMap<String, DrawOutcomes> = BTreeMap::new();
    for (row, r) in responses.iter().enumerate() {
        let label = labels.get(&r.id).ok_or_else(|| failed(format!("response for {} has no label", r.id)))?;
        if label.population != r.population {
            return Err(failed(format!(
                "problem {}: its page says population {}, its label {} (the pages evaluated and the labels are not of the same data)",
                r.id,
                r.population.as_deref().unwrap_or(ALL),
                label.population.as_deref().unwrap_or(ALL)
            )));
        }
        let population = r.population.clone().unwrap_or_else(|| ALL.to_string());
        let request = crate::reward::RewardRequest {
            id: r.id.clone(),
            row: row as u64,
            label: label.clone(),
            response: r.text.clone(),
            finish: r.finish,
            tokenization_valid: r.undecodable.is_empty(),
        };
        let scored = reward.score(&request).map_err(failed)?;
        let verdict = &scored.terms[0];
        let correct = match verdict.reward {
            1.0 => true,
            0.0 => false,
            x => {
                return Err(failed(format!(
                    "eval.score: response {row} (problem {}): the reward is {x}; scoring counts a response correct at 1 and wrong at 0 (a shaped reward belongs in train.grpo's `reward:`)",
                    r.id
                )))
            }
        };
        if r.mode == "greedy" {
            let outcome = ProblemOutcome { population: population.clone(), correct };
            if greedy_problems.insert(r.id.clone(), outcome).is_some() {
                return Err(failed(format!("problem {} has two greedy responses", r.id)));
            }
        } else if r.mode == "sample" {
            let o = sample_problems.entry(r.id.clone()).or_insert_with(|| DrawOutcomes {
                population: population.clone(),
                draws: 0,
                correct: 0,
            });
            if o.population != population {
                return Err(failed(format!(
                    "problem {} has draws in two populations ({} and {population})",
                    r.id, o.population
                )));
            }
            o.draws += 1;
            o.correct += usize::from(correct);
        }
        let tallied: BTreeSet<String> = [ALL.to_string(), population].into();
        for population in tallied {
            let t = tallies.entry((r.mode.clone(), population)).or_default();
            t.responses += 1;
            t.problems.insert(r.id.clone());
            t.correct += usize::from(correct);
            t.valid += usize::from(verdict.valid);
            t.without_eos += usize::from(r.finish != FinishReason::Eos);
            t.tokens += r.ids.len();
            if let Some(reason) = &verdict.reason {
                // A program's reasons are its own words: the first 80 characters count.
                let name: String = reason.chars().take(80).collect();
                *t.reasons.entry(name).or_default() += 1;
            }
        }
    }
    let mut mode = |name: &str| {
        ModeScores(
            populations
                .iter()
                .map(|p| {
                    let tally = tallies.remove(&(name.to_string(), p.to_string())).unwrap_or_default();
                    (p.to_string(), tally.score())
                })
                .collect(),
        )
    };
    let (greedy, sample) = (mode("greedy"), mode("sample"));
    Ok(EvalResults {
        verifier: VerifierRef { name: reward.name(), protocol_hash: reward.protocol_hash() },
        greedy,
        sample,
        metrics: [
            ("greedy_pass_at_1", "greedy.<population>.success_rate: one greedy response per problem"),
            (
                "per_draw_success",
                "sample.<population>.success_rate: every sampled response counts (problems × draws); it is not best-of-k",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        generation_seconds: None,
        peak_rss_bytes: None,
        device: summary.device.clone(),
        policy,
        greedy_problems,
        sample_problems: Some(sample_problems),
    })
}

#[cfg(test)]
mod tests {

    /// (Issue #34.) A label the worker never reads stays out of the key: two
    /// evaluations of the same model named differently are one computation.
    #[test]
    fn eval_generate_s_policy_label_is_not_in_the_key() {
        let registry = crate::ops::Registry::builtin();
        let op = registry.get("eval.generate").unwrap();
        let named = |policy: Option<&str>| {
            let mut p = serde_json::json!({"draws": 2});
            if let Some(name) = policy {
                p["policy"] = name.into();
            }
            op.parse(&p).unwrap().value().clone()
        };
        assert_eq!(named(Some("sft")), named(Some("grpo")));
        assert_eq!(named(Some("sft")), named(None));
        let other = op.parse(&serde_json::json!({"draws": 3})).unwrap();
        assert_ne!(other.value(), &named(None), "a param the worker reads is keyed");
    }
    use super::*;

    /// A test problem's label under id `t1` (ID50), an OOD100 one under `t2`
    /// (never answered here), and t1's reference (correct) response.
    fn one_test_problem() -> (BTreeMap<String, LabelRow>, String) {
        let counts = crate::data::generate::Counts {
            train: 1,
            validation: 1,
            test_id50: 1,
            test_ood100: 1,
            warmstart: 0,
            pretrain: 0,
            drills: 0,
        };
        let records = crate::data::generate::generate(0, &counts).unwrap();
        let test = |p| records.iter().find(|r| r.split == crate::data::Split::Test && r.population == p).unwrap();
        let label = |r: &crate::data::generate::Record, id: &str| {
            let mut l: LabelRow = serde_json::from_value(serde_json::to_value(r.label()).unwrap()).unwrap();
            l.id = id.into();
            (id.to_string(), l)
        };
        let (id50, ood) = (test(crate::data::Population::ID50), test(crate::data::Population::OOD100));
        let labels = [label(id50, "t1"), label(ood, "t2")].into();
        (labels, id50.reference_response.clone())
    }

    /// A response to `t1` (ID50).
    fn response(mode: &str, draw: usize, text: &str) -> EvalResponse {
        EvalResponse {
            id: "t1".into(),
            population: Some("ID50".into()),
            mode: mode.into(),
            draw,
            rollout_id: None,
            ids: vec![1, 2, 3],
            text: text.into(),
            finish: FinishReason::Eos,
            undecodable: vec![],
        }
    }

    fn results() -> EvalResults {
        let (labels, _) = one_test_problem();
        let summary =
            EvalSummary { problems: 1, draws: 0, generation_seconds: None, peak_rss_bytes: None, device: "Cpu".into() };
        score(&[response("greedy", 0, "not json")], &labels, &summary, PROTOCOL_VERIFIER, Some("sft".into())).unwrap()
    }

    #[test]
    fn an_empty_population_is_undefined_not_zero() {
        let r = results();
        let (id50, ood) = (r.greedy.population("ID50").unwrap(), r.greedy.population("OOD100").unwrap());
        assert_eq!(id50.responses, 1);
        assert_eq!(id50.success_rate, Some(0.0));
        assert_eq!(ood.success_rate, None, "a population of the labels that no response is in");
        assert!(ood.undefined_because.is_some());
        assert_eq!(r.sample.all().responses, 0);
        assert_eq!(r.greedy.names().collect::<Vec<_>>(), ["ALL", "ID50", "OOD100"]);
    }

    #[test]
    fn each_problems_draws_are_counted_and_results_without_them_still_read() {
        let (labels, right) = one_test_problem();
        let right = right.as_str();
        let responses = [
            response("greedy", 0, "not json"),
            response("sample", 0, right),
            response("sample", 1, "not json"),
            response("sample", 2, right),
        ];
        let summary =
            EvalSummary { problems: 1, draws: 3, generation_seconds: None, peak_rss_bytes: None, device: "Cpu".into() };
        let r = score(&responses, &labels, &summary, PROTOCOL_VERIFIER, None).unwrap();
        assert_eq!(r.sample.population("ID50").unwrap().correct, 2, "the reference response is scored correct");
        let draws = r.sample_problems.clone().unwrap();
        assert_eq!(draws["t1"], DrawOutcomes { population: "ID50".into(), draws: 3, correct: 2 });
        assert!(!r.greedy_problems["t1"].correct);
        // Results scored before version 3 have no per-problem draws: they read as None.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results");
        let mut v = serde_json::to_value(&r).unwrap();
        v.as_object_mut().unwrap().remove("sample_problems").unwrap();
        std::fs::write(&path, v.to_string()).unwrap();
        assert_eq!(EvalResults::read(&path).unwrap().sample_problems, None);
    }

    #[test]
    fn a_results_file_missing_a_field_is_an_error_naming_file_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results");
        let mut v = serde_json::to_value(results()).unwrap();
        std::fs::write(&path, v.to_string()).unwrap();
        assert_eq!(EvalResults::read(&path).unwrap(), results(), "what is written reads back");
        v["greedy"]["ALL"].as_object_mut().unwrap().remove("responses");
        std::fs::write(&path, v.to_string()).unwrap();
        let err = EvalResults::read(&path).unwrap_err().to_string();
        assert!(err.contains("results") && err.contains("greedy.ALL") && err.contains("responses"), "{err}");
        // A rate may be null (undefined), but not missing.
        let mut v = serde_json::to_value(results()).unwrap();
        v["sample"]["ID50"].as_object_mut().unwrap().remove("success_rate");
        std::fs::write(&path, v.to_string()).unwrap();
        let err = EvalResults::read(&path).unwrap_err().to_string();
        assert!(err.contains("sample.ID50") && err.contains("success_rate"), "{err}");
    }

    #[test]
    fn any_task_scores_with_its_verifier_and_the_populations_its_labels_name() {
        let label = |id: &str, answer: &str, population: Option<&str>| {
            let l = LabelRow {
                id: id.into(),
                split: crate::data::Split::Test,
                population: population.map(str::to_string),
                problem: serde_json::json!({"answer": answer}),
                target: None,
                warmstart: false,
                reference_response: None,
                template: None,
            };
            (id.to_string(), l)
        };
        let answer = |id: &str, population: Option<&str>, text: &str| EvalResponse {
            id: id.into(),
            population: population.map(str::to_string),
            text: text.into(),
            ..response("greedy", 0, "")
        };
        let summary =
            EvalSummary { problems: 2, draws: 0, generation_seconds: None, peak_rss_bytes: None, device: "Cpu".into() };
        // No population field: ALL only.
        let labels: BTreeMap<_, _> = [label("a", "#### 42", None), label("b", "7", None)].into();
        let rs = [answer("a", None, "so 40 + 2 = 42"), answer("b", None, "it is 8")];
        let r = score(&rs, &labels, &summary, "gsm8k_last_number", None).unwrap();
        assert_eq!(r.verifier.name, "gsm8k_last_number");
        assert_eq!(r.greedy.names().collect::<Vec<_>>(), ["ALL"]);
        assert_eq!((r.greedy.all().correct, r.greedy.all().success_rate), (1, Some(0.5)));
        assert_eq!(r.greedy_problems["a"].population, "ALL");
        // The protocol's verifier refuses such a problem, naming itself.
        let e = score(&rs, &labels, &summary, PROTOCOL_VERIFIER, None).unwrap_err().to_string();
        assert!(e.contains("stock_arithmetic_v1"), "{e}");
        // User populations are reported like ID50/OOD100, and a page and label that disagree are refused.
        let labels: BTreeMap<_, _> = [label("a", "42", Some("easy")), label("b", "7", Some("hard"))].into();
        let rs = [answer("a", Some("easy"), "42"), answer("b", Some("hard"), "7")];
        let r = score(&rs, &labels, &summary, "gsm8k_last_number", None).unwrap();
        assert_eq!(r.greedy.names().collect::<Vec<_>>(), ["ALL", "easy", "hard"]);
        assert_eq!(r.greedy.population("hard").unwrap().correct, 1);
        let e = score(&[answer("a", Some("hard"), "42")], &labels, &summary, "gsm8k_last_number", None).unwrap_err();
        assert!(e.to_string().contains("its page says population hard, its label easy"), "{e}");
    }
}
