//! `dataset.import`: the user's own data (JSON lines, JSON, CSV or Parquet)
//! as the same pages and labels artifacts `dataset.stock_arithmetic` writes,
//! with the same taints, so the compile-time isolation holds for it too: its
//! test labels cannot reach a training node. A file given to it is in the
//! node key by content.
//!
//! Rows are checked before anything is written: every mapped field present
//! and of the right type, ids unique, and no prompt in two rows (after
//! lower-casing and collapsing whitespace), within a split or across splits.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::dataset::{labels_output, pages_output, split_outputs, write};
use super::{Op, OpError, OutputDecl, ParamError, RunContext};
use crate::data::rng::Stream;
use crate::data::rows::{LabelRow, PageRow, ALL_POPULATION};
use crate::data::table::{SourceRow, TableFormat};
use crate::data::Split;

/// Which of a row's fields is what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldMap {
    /// The field (column) holding the prompt text: the page's statement.
    pub prompt: String,
    /// The field holding the answer: the label's `problem.answer`, what an
    /// answer-matching verifier (`gsm8k_last_number`) scores against.
    pub answer: String,
    /// The field holding each row's id (text or integer). Absent: an id
    /// from the content (`h` and 16 hex digits of blake3 of prompt and answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The field naming each row's population (reported beside ALL by
    /// `eval.score`). Absent: ALL only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub population: Option<String>,
    /// The response `train.sft` trains on: a field's name, or a template
    /// naming fields in braces (`"#### {answer}"`; `{{` and `}}` for braces).
    /// Absent: the data can be used by `train.grpo` and evaluation, not SFT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_response: Option<String>,
    /// More fields copied, with their JSON values, into the label's
    /// `problem` beside `answer` (`[nums, target]` for Countdown): what a
    /// reward program reads (`req["label"]["problem"]["nums"]`), as TRL hands
    /// a reward function every column.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problem_fields: Vec<String>,
}

/// Params of `dataset.import`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportParams {
    /// One file per split, relative to the spec's folder:
    /// `{train: data/train.jsonl, test: data/test.jsonl}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<Split, String>,
    /// Or one file, split by `ratios` after a shuffle seeded by `seed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// With `file`: each split's share, summing to 1 (`{train: 0.8, validation: 0.1, test: 0.1}`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ratios: BTreeMap<Split, f64>,
    /// With `file`: the seed of the shuffle that assigns rows to splits.
    #[serde(default)]
    pub seed: u64,
    /// How the files are read; absent: by extension (`.jsonl`/`.ndjson`,
    /// `.json`, `.csv`, `.parquet`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<TableFormat>,
    pub fields: FieldMap,
    /// The first N train rows (in file order) form the warm-start SFT set
    /// (`warmstart: true` in their labels); the others are the pool that
    /// `train.sft` with `branch: sft` and `train.grpo` draw from.
    #[serde(default)]
    pub warmstart: usize,
}

impl ImportParams {
    /// (split, file) for every file read.
    fn sources(&self) -> Vec<(Option<Split>, &str)> {
        match &self.file {
            Some(f) => vec![(None, f.as_str())],
            None => self.files.iter().map(|(s, f)| (Some(*s), f.as_str())).collect(),
        }
    }

    /// The splits written.
    fn splits(&self) -> Vec<Split> {
        if self.file.is_some() {
            self.ratios.keys().copied().collect()
        } else {
            self.files.keys().copied().collect()
        }
    }
}

/// How a file is read: the `format` param, else the extension.
fn format_of(format: Option<TableFormat>, file: &str) -> Result<TableFormat, String> {
    format.or_else(|| TableFormat::of(file)).ok_or_else(|| {
        format!("'{file}': the extension does not say how to read it (.jsonl, .ndjson, .json, .csv, .parquet); set params.format")
    })
}

/// The checks `dataset.import` and `dataset.hub` share: the field mapping,
/// and a warm-start set only with a train split.
fn check_fields(fields: &FieldMap, warmstart: usize, splits: &[Split]) -> Result<(), ParamError> {
    fields.columns().map_err(|m| param_error(&["fields", "reference_response"], m))?;
    if warmstart > 0 && !splits.contains(&Split::Train) {
        return Err(param_error(
            &["warmstart"],
            "the warm-start set is drawn from the train split, and there is none".into(),
        ));
    }
    Ok(())
}

fn param_error(path: &[&str], message: String) -> ParamError {
    ParamError { path: path.iter().map(|s| s.to_string()).collect(), message, unknown_key: false }
}

/// A `reference_response` template's parts: literal text and field names.
#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Field(String),
}

/// Parses `"#### {answer}"`; a string without braces is a field name.
fn template(spec: &str) -> Result<Vec<Part>, String> {
    if !spec.contains(['{', '}']) {
        return Ok(vec![Part::Field(spec.to_string())]);
    }
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut chars = spec.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => name.push(c),
                        None => return Err(format!("'{spec}': a '{{' without its '}}'")),
                    }
                }
                if name.trim().is_empty() {
                    return Err(format!("'{spec}': an empty field name in braces"));
                }
                if !text.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut text)));
                }
                parts.push(Part::Field(name.trim().to_string()));
            }
            '}' => return Err(format!("'{spec}': a '}}' without its '{{' (write '}}}}' for a brace)")),
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok(parts)
}

impl FieldMap {
    /// Every source field read, once.
    fn columns(&self) -> Result<Vec<String>, String> {
        let mut out: BTreeSet<String> = [self.prompt.clone(), self.answer.clone()].into();
        out.extend(self.id.iter().cloned());
        out.extend(self.population.iter().cloned());
        out.extend(self.problem_fields.iter().cloned());
        if let Some(r) = &self.reference_response {
            for p in template(r)? {
                if let Part::Field(f) = p {
                    out.insert(f);
                }
            }
        }
        Ok(out.into_iter().collect())
    }
}

pub struct DatasetImport;

impl Op for DatasetImport {
    fn name(&self) -> &'static str {
        "dataset.import"
    }
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "the user's data (JSON lines, JSON, CSV, Parquet) as pages and labels per split, overlap refused"
    }
    type Params = ImportParams;
    fn check(&self, p: &Self::Params) -> Result<(), ParamError> {
        match (&p.file, p.files.is_empty()) {
            (Some(_), false) => {
                return Err(param_error(
                    &["file"],
                    "give either `files` (one per split) or `file` with `ratios`, not both".into(),
                ))
            }
            (None, true) => {
                return Err(param_error(
                    &["files"],
                    "no data: give `files: {train: FILE, …}` (one per split) or `file: FILE` with `ratios`".into(),
                ))
            }
            (None, false) if !p.ratios.is_empty() => {
                return Err(param_error(
                    &["ratios"],
                    "`ratios` splits one `file`; with `files` each file is its split".into(),
                ))
            }
            (Some(_), true) => {
                if p.ratios.is_empty() {
                    return Err(param_error(
                        &["ratios"],
                        "`file` needs `ratios`: each split's share, e.g. {train: 0.9, test: 0.1}".into(),
                    ));
                }
                for (s, r) in &p.ratios {
                    if !(r.is_finite() && *r > 0.0 && *r <= 1.0) {
                        return Err(param_error(&["ratios", s.as_str()], format!("{r} is not a share in (0, 1]")));
                    }
                }
                let sum: f64 = p.ratios.values().sum();
                if (sum - 1.0).abs() > 1e-9 {
                    return Err(param_error(&["ratios"], format!("the shares sum to {sum}, not 1")));
                }
            }
            _ => {}
        }
        for (split, file) in p.sources() {
            let at: Vec<&str> = match split {
                Some(s) => vec!["files", s.as_str()],
                None => vec!["file"],
            };
            if super::shell::normalize_rel(file).is_none() {
                return Err(param_error(
                    &at,
                    format!("'{file}': expected a path relative to the spec's folder, inside it"),
                ));
            }
            format_of(p.format, file).map_err(|m| param_error(&at, m))?;
        }
        check_fields(&p.fields, p.warmstart, &p.splits())
    }
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<super::InputDecl>> {
        Some(Vec::new())
    }
    fn file_deps(&self, p: &Self::Params, _spec_dir: &std::path::Path) -> Vec<String> {
        p.sources().iter().filter_map(|(_, f)| super::shell::normalize_rel(f)).collect()
    }
    fn data_sources(&self, p: &Self::Params) -> Vec<super::DataSource> {
        let both = |s: Split| [super::Taint::Pages(s), super::Taint::Labels(s)];
        p.sources()
            .into_iter()
            .filter_map(|(split, file)| {
                let path = super::shell::normalize_rel(file)?;
                Some(match split {
                    Some(s) => super::DataSource {
                        path,
                        taints: both(s).to_vec(),
                        how: format!("imports as its {} split", s.as_str()),
                    },
                    None => super::DataSource {
                        path,
                        taints: p.splits().into_iter().flat_map(both).collect(),
                        how: format!(
                            "splits into {}",
                            p.splits().iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                        ),
                    },
                })
            })
            .collect()
    }
    fn outputs(&self, p: &Self::Params) -> Vec<OutputDecl> {
        split_outputs(&p.splits())
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let failed = |m: String| OpError::Failed(m);
        let columns = p.fields.columns().map_err(failed)?;
        let columns: Vec<&str> = columns.iter().map(String::as_str).collect();
        let mut by_split: BTreeMap<Split, Vec<SourceRow>> = BTreeMap::new();
        for (split, file) in p.sources() {
            let rel = super::shell::normalize_rel(file)
                .ok_or_else(|| failed(format!("'{file}': not inside the spec's folder")))?;
            let format = format_of(p.format, file).map_err(failed)?;
            let opened = crate::store::fsx::open_user_file(ctx.spec_dir, &rel).map_err(|e| failed(e.to_string()))?;
            let again = opened.try_clone().map_err(|e| failed(format!("'{rel}': {e}")))?;
            let rows =
                crate::data::table::read_file(opened, &rel, format, &columns).map_err(|e| failed(e.to_string()))?;
            // The rows are from the bytes the key holds, or the node fails.
            ctx.check_keyed_open_file(&rel, &again)?;
            match split {
                Some(s) => {
                    by_split.insert(s, rows);
                }
                None => by_split = split_by_ratios(rows, &p.ratios, p.seed),
            }
        }
        let imported = convert(&by_split, &p.fields, p.warmstart).map_err(|e| failed(e.to_string()))?;
        write_splits(ctx, &imported)?;
        let sources =
            p.sources().iter().map(|(s, f)| (s.map_or("all", |s| s.as_str()).to_string(), f.to_string())).collect();
        write_summary(ctx, "import", sources, &imported)
    }
}

/// Params of `dataset.hub`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DatasetHubParams {
    /// The Hub dataset repo, `owner/name` (`openai/gsm8k`).
    pub repo: String,
    /// The full 40-character commit id (a branch or tag is refused: it moves).
    pub revision: String,
    /// The dataset's config: the repo folder its files are in (`main` for
    /// openai/gsm8k). With `splits`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// Our split → the Hub's split name (`{train: train, test: test}`): the
    /// files `CONFIG/NAME-*.parquet` (the Hub's Parquet layout, every shard,
    /// in name order) or `CONFIG/NAME.{parquet,jsonl,json,csv}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub splits: BTreeMap<Split, String>,
    /// Or our split → the repo files it is read from, in order (shards).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<Split, Vec<String>>,
    /// How the files are read; absent: by extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<TableFormat>,
    pub fields: FieldMap,
    /// The first N train rows (in file order) form the warm-start SFT set.
    #[serde(default)]
    pub warmstart: usize,
    /// The last N rows of the train split (in file order) become the
    /// validation split, for a dataset that ships none (openai/gsm8k).
    /// Absent from the key when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub validation_from_train: Option<usize>,
}

impl DatasetHubParams {
    fn splits_written(&self) -> Vec<Split> {
        let mut out: Vec<Split> = if self.files.is_empty() {
            self.splits.keys().copied().collect()
        } else {
            self.files.keys().copied().collect()
        };
        if self.validation_from_train.is_some() && !out.contains(&Split::Validation) {
            out.push(Split::Validation);
            out.sort();
        }
        out
    }
}

/// Whether a repo file is the Hub's file of a split in a config folder.
fn is_split_file(path: &str, config: &str, split: &str) -> bool {
    let Some(name) = path.strip_prefix(config).and_then(|r| r.strip_prefix('/')) else { return false };
    let sharded = name.strip_prefix(split).and_then(|r| r.strip_prefix('-')).is_some_and(|r| r.ends_with(".parquet"));
    let single = ["parquet", "jsonl", "json", "csv"].iter().any(|ext| name == format!("{split}.{ext}"));
    sharded || single
}

/// `dataset.hub`: a Hugging Face dataset repo pinned by commit, through the
/// same cache code as `model.hub` (`datasets--owner--name`, every file checked
/// against the hash the Hub announced, `HF_HUB_OFFLINE`, `HF_TOKEN`), then
/// converted as `dataset.import` converts, with the same checks and taints.
/// The key is the repo, the commit and the params: a commit names its files' content.
pub struct DatasetHub;

impl Op for DatasetHub {
    fn name(&self) -> &'static str {
        "dataset.hub"
    }
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "a Hugging Face dataset pinned by commit (Parquet, JSON lines, CSV), as pages and labels per split"
    }
    type Params = DatasetHubParams;
    fn check(&self, p: &Self::Params) -> Result<(), ParamError> {
        crate::hub::check_repo(&p.repo).map_err(|m| param_error(&["repo"], m.to_string()))?;
        crate::hub::check_commit(&p.repo, &p.revision).map_err(|m| param_error(&["revision"], m.to_string()))?;
        match (p.splits.is_empty(), p.files.is_empty()) {
            (true, true) => {
                return Err(param_error(
                    &["splits"],
                    "no data: give `config` and `splits: {train: train, test: test}`, or `files: {train: [FILE, …]}`"
                        .into(),
                ))
            }
            (false, false) => {
                return Err(param_error(&["files"], "give either `splits` (with `config`) or `files`, not both".into()))
            }
            (false, true) if p.config.is_none() => {
                return Err(param_error(
                    &["config"],
                    "`splits` needs `config`: the repo folder of the files (`main` for openai/gsm8k)".into(),
                ))
            }
            _ => {}
        }
        for (split, files) in &p.files {
            if files.is_empty() {
                return Err(param_error(&["files", split.as_str()], "no file".into()));
            }
            for f in files {
                format_of(p.format, f).map_err(|m| param_error(&["files", split.as_str()], m))?;
            }
        }
        if let Some(n) = p.validation_from_train {
            let read: Vec<Split> =
                if p.files.is_empty() { p.splits.keys().copied().collect() } else { p.files.keys().copied().collect() };
            if read.contains(&Split::Validation) {
                return Err(param_error(
                    &["validation_from_train"],
                    "the data already has a validation split; drop one of the two".into(),
                ));
            }
            if !read.contains(&Split::Train) || n == 0 {
                return Err(param_error(
                    &["validation_from_train"],
                    format!("{n}: expected a positive number of rows taken from the train split"),
                ));
            }
        }
        check_fields(&p.fields, p.warmstart, &p.splits_written())
    }
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<super::InputDecl>> {
        Some(Vec::new())
    }
    fn outputs(&self, p: &Self::Params) -> Vec<OutputDecl> {
        split_outputs(&p.splits_written())
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        use std::io::IsTerminal;
        let failed = |m: String| OpError::Failed(m);
        let config = crate::hub::HubConfig::from_env().map_err(|e| failed(e.to_string()))?;
        let mut snap = crate::hub::Snapshot::of_kind(&config, crate::hub::RepoKind::Dataset, &p.repo, &p.revision)
            .map_err(|e| failed(e.to_string()))?;
        snap.progress = std::io::stderr().is_terminal();
        let mut wanted: BTreeMap<Split, Vec<String>> = p.files.clone();
        if wanted.is_empty() {
            let folder = p.config.clone().unwrap_or_default();
            let listed = snap.list(&folder).map_err(|e| failed(e.to_string()))?;
            for (split, name) in &p.splits {
                let files: Vec<String> = listed.iter().filter(|f| is_split_file(f, &folder, name)).cloned().collect();
                if files.is_empty() {
                    return Err(failed(format!(
                        "{} at {}: no file of split '{name}' in {folder}/ (expected {folder}/{name}-*.parquet or {folder}/{name}.jsonl; it has: {})",
                        p.repo,
                        p.revision,
                        if listed.is_empty() { "nothing".to_string() } else { listed.join(", ") }
                    )));
                }
                wanted.insert(*split, files);
            }
        }
        let columns = p.fields.columns().map_err(failed)?;
        let columns: Vec<&str> = columns.iter().map(String::as_str).collect();
        let mut log = ctx.open_log()?;
        let mut by_split: BTreeMap<Split, Vec<SourceRow>> = BTreeMap::new();
        let mut sources = BTreeMap::new();
        for (split, files) in &wanted {
            let mut rows = Vec::new();
            for file in files {
                let got = snap.fetch(file).map_err(|e| failed(e.to_string()))?.ok_or_else(|| {
                    failed(format!("{file} is not in {} at {} ({})", p.repo, p.revision, config.endpoint))
                })?;
                let _ = writeln!(log, "{got}");
                let opened = std::fs::File::open(&got.path)
                    .map_err(|e| OpError::io(format!("reading {}", got.path.display()), e))?;
                rows.extend(
                    crate::data::table::read_file(opened, file, format_of(p.format, file).map_err(failed)?, &columns)
                        .map_err(|e| failed(e.to_string()))?,
                );
            }
            by_split.insert(*split, rows);
            sources.insert(split.as_str().to_string(), format!("{}@{}: {}", p.repo, p.revision, files.join(", ")));
        }
        if let Some(n) = p.validation_from_train {
            let train = by_split.get_mut(&Split::Train).expect("checked: train is read");
            if n >= train.len() {
                return Err(failed(format!(
                    "validation_from_train: {n} rows of a train split of {} would leave no train rows",
                    train.len()
                )));
            }
            let validation = train.split_off(train.len() - n);
            by_split.insert(Split::Validation, validation);
            sources.insert("validation".into(), format!("the last {n} rows of train"));
        }
        let imported = convert(&by_split, &p.fields, p.warmstart).map_err(|e| failed(e.to_string()))?;
        write_splits(ctx, &imported)?;
        write_summary(ctx, "hub", sources, &imported)
    }
}

fn write_summary(
    ctx: &RunContext<'_>,
    dataset: &str,
    sources: BTreeMap<String, String>,
    imported: &BTreeMap<Split, Vec<(PageRow, LabelRow)>>,
) -> Result<(), OpError> {
    let summary = ImportSummary {
        dataset: dataset.into(),
        sources,
        counts: imported.iter().map(|(s, rows)| (s.as_str().to_string(), rows.len())).collect(),
        warmstart: imported.get(&Split::Train).map_or(0, |r| r.iter().filter(|(_, l)| l.warmstart).count()),
        populations: imported
            .iter()
            .map(|(s, rows)| {
                let mut counts: BTreeMap<String, usize> = BTreeMap::new();
                for (page, _) in rows {
                    *counts.entry(page.population.clone().unwrap_or_else(|| ALL_POPULATION.into())).or_default() += 1;
                }
                (s.as_str().to_string(), counts)
            })
            .collect(),
    };
    let text = serde_json::to_vec_pretty(&summary).map_err(|e| OpError::Failed(e.to_string()))?;
    write(ctx, "summary", &[text, b"\n".to_vec()].concat())
}

/// What `dataset.import` and `dataset.hub` write as `summary`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportSummary {
    pub dataset: String,
    /// Split (or `all` for a file split by ratios) → the file read.
    pub sources: BTreeMap<String, String>,
    /// Split → problems.
    pub counts: BTreeMap<String, usize>,
    pub warmstart: usize,
    /// Split → population → problems (`ALL` for rows without a population).
    pub populations: BTreeMap<String, BTreeMap<String, usize>>,
}

/// The rows of one file assigned to splits: a shuffle seeded by `seed`, then
/// contiguous shares (boundaries at the rounded cumulative share), each split
/// kept in file order.
pub fn split_by_ratios(
    rows: Vec<SourceRow>,
    ratios: &BTreeMap<Split, f64>,
    seed: u64,
) -> BTreeMap<Split, Vec<SourceRow>> {
    let n = rows.len();
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = Stream::new(seed, "dataset.import/split");
    for i in (1..n).rev() {
        let j = rng.int_inclusive(0, i as u32) as usize;
        order.swap(i, j);
    }
    let mut assigned = vec![Split::Train; n];
    let mut cumulative = 0.0;
    let mut start = 0;
    let last = ratios.len() - 1;
    for (k, (split, share)) in ratios.iter().enumerate() {
        cumulative += share;
        let end = if k == last { n } else { ((cumulative * n as f64).round() as usize).min(n) };
        for &i in &order[start..end.max(start)] {
            assigned[i] = *split;
        }
        start = end.max(start);
    }
    let mut out: BTreeMap<Split, Vec<SourceRow>> = ratios.keys().map(|s| (*s, Vec::new())).collect();
    for (row, split) in rows.into_iter().zip(assigned) {
        out.get_mut(&split).expect("every split has a list").push(row);
    }
    out
}

/// A prompt as overlap is checked on: lower-cased, whitespace collapsed.
pub fn normalized_prompt(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

fn text_of(row: &SourceRow, field: &str, what: &str) -> Result<String, String> {
    match row.values.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) if what != "prompt" => Ok(n.to_string()),
        Some(Value::Null) | None => Err(format!("{}: field '{field}' ({what}) is empty (null)", row.at)),
        Some(other) => Err(format!(
            "{}: field '{field}' ({what}) is {}, expected text{}",
            row.at,
            kind(other),
            if what == "prompt" { "" } else { " or a number" }
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Converts checked rows into pages and labels, per split. Refused, naming
/// both rows: two rows with the same id, or the same prompt (normalized).
pub fn convert(
    by_split: &BTreeMap<Split, Vec<SourceRow>>,
    fields: &FieldMap,
    warmstart: usize,
) -> Result<BTreeMap<Split, Vec<(PageRow, LabelRow)>>, crate::data::rows::RowError> {
    convert_rows(by_split, fields, warmstart).map_err(crate::data::rows::RowError)
}

/// [`convert`], each refusal said as a message naming the rows.
fn convert_rows(
    by_split: &BTreeMap<Split, Vec<SourceRow>>,
    fields: &FieldMap,
    warmstart: usize,
) -> Result<BTreeMap<Split, Vec<(PageRow, LabelRow)>>, String> {
    let reference = fields.reference_response.as_deref().map(template).transpose()?;
    let mut ids: HashMap<String, String> = HashMap::new();
    let mut prompts: HashMap<String, (String, Split)> = HashMap::new();
    let mut out = BTreeMap::new();
    for (split, rows) in by_split {
        if *split == Split::Train && warmstart > rows.len() {
            return Err(format!("warmstart is {warmstart}, but the train split has {} rows", rows.len()));
        }
        let mut converted = Vec::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            let prompt = text_of(row, &fields.prompt, "prompt")?;
            if prompt.trim().is_empty() {
                return Err(format!("{}: field '{}' (prompt) is blank", row.at, fields.prompt));
            }
            let answer = match row.values.get(&fields.answer) {
                Some(v @ (Value::String(_) | Value::Number(_))) => v.clone(),
                Some(Value::Null) | None => {
                    return Err(format!("{}: field '{}' (answer) is empty (null)", row.at, fields.answer))
                }
                Some(other) => {
                    return Err(format!(
                        "{}: field '{}' (answer) is {}, expected text or a number",
                        row.at,
                        fields.answer,
                        kind(other)
                    ))
                }
            };
            let id = match &fields.id {
                Some(f) => text_of(row, f, "id")?,
                None => {
                    let mut h = blake3::Hasher::new();
                    h.update(b"orchestrate.import.id.v1\0");
                    h.update(prompt.as_bytes());
                    h.update(b"\0");
                    h.update(crate::canonical::canonical_json(&answer).as_bytes());
                    format!("h{}", &h.finalize().to_hex()[..16])
                }
            };
            if id.is_empty() {
                return Err(format!("{}: the id is empty", row.at));
            }
            let population = match &fields.population {
                Some(f) => {
                    let p = text_of(row, f, "population")?;
                    if p.is_empty() || p == ALL_POPULATION {
                        return Err(format!(
                            "{}: field '{f}' (population) is '{p}'; a population is a non-empty name other than ALL (every problem is in ALL)",
                            row.at
                        ));
                    }
                    Some(p)
                }
                None => None,
            };
            let norm = normalized_prompt(&prompt);
            if let Some((first, first_split)) = prompts.get(&norm) {
                let same = if first_split == split { "in the same split" } else { "across splits" };
                return Err(format!(
                    "{first} and {} have the same prompt (after lower-casing and collapsing whitespace), {same} ({} and {}): remove one; a problem in two places would leak or count twice",
                    row.at,
                    first_split.as_str(),
                    split.as_str()
                ));
            }
            if let Some(first) = ids.get(&id) {
                return Err(format!("{first} and {} have the same id '{id}'", row.at));
            }
            prompts.insert(norm, (row.at.clone(), *split));
            ids.insert(id.clone(), row.at.clone());
            let reference_response = match &reference {
                None => None,
                Some(parts) => {
                    let mut s = String::new();
                    for p in parts {
                        match p {
                            Part::Text(t) => s.push_str(t),
                            Part::Field(f) => s.push_str(&text_of(row, f, "reference_response")?),
                        }
                    }
                    Some(s)
                }
            };
            let mut problem = serde_json::Map::new();
            problem.insert("answer".into(), answer);
            for f in &fields.problem_fields {
                if f == "answer" {
                    return Err("problem_fields: 'answer' is the problem's answer already (fields.answer)".into());
                }
                match row.values.get(f) {
                    Some(Value::Null) | None => {
                        return Err(format!("{}: field '{f}' (one of problem_fields) is missing or null", row.at))
                    }
                    Some(v) => {
                        problem.insert(f.clone(), v.clone());
                    }
                }
            }
            let page = PageRow { id: id.clone(), split: *split, population: population.clone(), statement: prompt };
            let label = LabelRow {
                id,
                split: *split,
                population,
                problem: Value::Object(problem),
                target: None,
                warmstart: *split == Split::Train && i < warmstart,
                reference_response,
                template: None,
            };
            converted.push((page, label));
        }
        out.insert(*split, converted);
    }
    Ok(out)
}

/// Writes `pages.<split>` and `labels.<split>` for every split.
pub fn write_splits(ctx: &RunContext<'_>, imported: &BTreeMap<Split, Vec<(PageRow, LabelRow)>>) -> Result<(), OpError> {
    for (split, rows) in imported {
        let mut pages = Vec::new();
        let mut labels = Vec::new();
        for (page, label) in rows {
            serde_json::to_writer(&mut pages, page).map_err(|e| OpError::Failed(e.to_string()))?;
            pages.push(b'\n');
            serde_json::to_writer(&mut labels, label).map_err(|e| OpError::Failed(e.to_string()))?;
            labels.push(b'\n');
        }
        write(ctx, &pages_output(*split), &pages)?;
        write(ctx, &labels_output(*split), &labels)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: usize, values: serde_json::Value) -> SourceRow {
        SourceRow { at: format!("d.jsonl row {n}"), values: serde_json::from_value(values).unwrap() }
    }

    fn fields() -> FieldMap {
        FieldMap {
            prompt: "question".into(),
            answer: "answer".into(),
            id: None,
            population: None,
            reference_response: Some("#### {answer}".into()),
            problem_fields: vec![],
        }
    }

    #[test]
    fn templates_name_fields_and_escape_braces() {
        assert_eq!(template("answer").unwrap(), [Part::Field("answer".into())]);
        assert_eq!(
            template("{{x}} #### { answer }").unwrap(),
            [Part::Text("{x} #### ".into()), Part::Field("answer".into())]
        );
        assert!(template("#### {answer").unwrap_err().contains("without its"));
        assert!(template("a } b").unwrap_err().contains("without its"));
    }

    #[test]
    fn rows_become_pages_and_labels_and_overlap_is_refused_naming_both_rows() {
        let train = vec![
            row(1, serde_json::json!({"question": "What is 2+2?", "answer": "4"})),
            row(2, serde_json::json!({"question": "What is 3+3?", "answer": 6})),
        ];
        let test = vec![row(1, serde_json::json!({"question": "What is 5+5?", "answer": "10"}))];
        let by_split = BTreeMap::from([(Split::Train, train.clone()), (Split::Test, test)]);
        let out = convert(&by_split, &fields(), 1).unwrap();
        let (page, label) = &out[&Split::Train][0];
        assert_eq!(page.statement, "What is 2+2?");
        assert_eq!(label.problem, serde_json::json!({"answer": "4"}));
        assert_eq!(label.reference_response.as_deref(), Some("#### 4"));
        assert!(label.warmstart && !out[&Split::Train][1].1.warmstart);
        assert_eq!(out[&Split::Train][1].1.reference_response.as_deref(), Some("#### 6"));
        assert!(page.id.starts_with('h') && page.id.len() == 17);
        // The same prompt, differently spaced and cased, in the test split.
        let leak = vec![SourceRow {
            at: "t.jsonl row 7".into(),
            ..row(7, serde_json::json!({"question": "what  is 3+3?", "answer": "6"}))
        }];
        let by_split = BTreeMap::from([(Split::Train, train.clone()), (Split::Test, leak)]);
        let e = convert(&by_split, &fields(), 0).unwrap_err().to_string();
        assert!(
            e.to_string().contains("d.jsonl row 2 and t.jsonl row 7") && e.to_string().contains("across splits"),
            "{e}"
        );
        // Duplicate ids from an id field.
        let dup = vec![
            row(1, serde_json::json!({"question": "a", "answer": "1", "k": 5})),
            row(2, serde_json::json!({"question": "b", "answer": "2", "k": 5})),
        ];
        let f = FieldMap { id: Some("k".into()), ..fields() };
        let e = convert(&BTreeMap::from([(Split::Train, dup)]), &f, 0).unwrap_err().to_string();
        assert!(e.contains("row 1 and d.jsonl row 2 have the same id '5'"), "{e}");
        // A population of ALL, a prompt that is not text, an answer that is null.
        let f = FieldMap { population: Some("p".into()), ..fields() };
        let bad = vec![row(3, serde_json::json!({"question": "a", "answer": "1", "p": "ALL"}))];
        assert!(convert(&BTreeMap::from([(Split::Test, bad)]), &f, 0)
            .unwrap_err()
            .to_string()
            .contains("other than ALL"));
        let bad = vec![row(4, serde_json::json!({"question": 12, "answer": "1"}))];
        let e = convert(&BTreeMap::from([(Split::Test, bad)]), &fields(), 0).unwrap_err().to_string();
        assert!(e.contains("d.jsonl row 4: field 'question' (prompt) is a number, expected text"), "{e}");
        let bad = vec![row(5, serde_json::json!({"question": "q", "answer": null}))];
        assert!(convert(&BTreeMap::from([(Split::Test, bad)]), &fields(), 0)
            .unwrap_err()
            .to_string()
            .contains("row 5: field 'answer'"));
        let e = convert(&BTreeMap::from([(Split::Train, train)]), &fields(), 3).unwrap_err().to_string();
        assert!(e.contains("warmstart is 3, but the train split has 2 rows"), "{e}");
    }

    #[test]
    fn a_seeded_ratio_split_is_deterministic_exact_in_size_and_in_file_order() {
        let rows: Vec<SourceRow> =
            (0..100).map(|i| row(i + 1, serde_json::json!({"question": format!("q{i}")}))).collect();
        let ratios = BTreeMap::from([(Split::Train, 0.8), (Split::Validation, 0.1), (Split::Test, 0.1)]);
        let a = split_by_ratios(rows.clone(), &ratios, 7);
        let b = split_by_ratios(rows.clone(), &ratios, 7);
        let c = split_by_ratios(rows, &ratios, 8);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!([a[&Split::Train].len(), a[&Split::Validation].len(), a[&Split::Test].len()], [80, 10, 10]);
        let order: Vec<usize> = a[&Split::Train].iter().map(|r| r.at[12..].parse().unwrap()).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "file order kept within a split: {order:?}");
    }
}
