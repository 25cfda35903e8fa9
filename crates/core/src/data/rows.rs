//! The pages and labels format: what every dataset op writes
//! (`dataset.stock_arithmetic`, `dataset.import`, `dataset.hub`) and every op
//! that trains, evaluates or scores reads. One JSON object per line; a page
//! is what a model may see, its label (joined by `id`) what the verifier and
//! the supervised trainer read. docs/data.md says it in words and
//! `schemas/pages.schema.json` / `schemas/labels.schema.json` are generated
//! from these types.
//!
//! Every reader goes through [`read_pages`] / [`read_labels`]: a missing or
//! ill-typed field is an error naming the file, the row and the field, and
//! what the field selects, never a default.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Split;

/// The longest row read from a pages or labels file (4 MiB).
pub const MAX_ROW_BYTES: usize = 4 << 20;

/// The population every problem is tallied in; no row may name it.
pub const ALL_POPULATION: &str = "ALL";

/// One page: what a model may see of a problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PageRow {
    /// Unique in the dataset (every split); joins the page with its label.
    pub id: String,
    pub split: Split,
    /// The population `eval.score` tallies the problem in besides `ALL`
    /// (`ID50`, `OOD100`, or any name of the user's data). Absent: `ALL` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub population: Option<String>,
    /// The prompt text, as the chat template's user message.
    pub statement: String,
}

/// One label: what the verifier and the supervised trainer read of a problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelRow {
    pub id: String,
    pub split: Split,
    /// The same as its page's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub population: Option<String>,
    /// What the verifier scores a response against: StockArithmetic's
    /// `{initial, deliveries, withdrawals}`, or `{answer}` for an answer-matching
    /// verifier such as `gsm8k_last_number`.
    pub problem: Value,
    /// The expected answer, for people reading the labels (verifiers compute
    /// or read their own from `problem`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Value>,
    /// In the train split, `true` puts the problem in the warm-start SFT set
    /// (`train.sft` with `branch: warmstart`) and `false` in the pool that
    /// `branch: sft` and `train.grpo` draw from. `false` in other splits.
    pub warmstart: bool,
    /// The response `train.sft` trains on (the end-of-sequence token is
    /// appended). Absent: the problem cannot be used for SFT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_response: Option<String>,
    /// StockArithmetic's statement template (0..7; 8 for drills).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<usize>,
}

/// What a field of a row is for, said with an error about it.
fn purpose(field: &str) -> &'static str {
    match field {
        "id" => "it joins a page with its label",
        "split" => "one of train, validation, test, pretrain, drills",
        "statement" => "the prompt text the model sees",
        "population" => "the population eval.score tallies the problem in besides ALL (leave it out for ALL only)",
        "problem" => "what the verifier scores a response against",
        "warmstart" => {
            "true selects the warm-start SFT set, false the pool that `branch: sft` and train.grpo draw from"
        }
        "reference_response" => "the response train.sft trains on",
        "template" => "StockArithmetic's statement template",
        "target" => "the expected answer, for people",
        _ => "",
    }
}

/// A row of a pages or labels file that cannot be read, or a join that fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RowError(pub String);

/// One line of a JSON-lines file, as [`next_line`] reads it.
pub(crate) enum Line<'a> {
    /// The line's text, without its line ending.
    Text(&'a str),
    /// Over [`MAX_ROW_BYTES`], its line ending included.
    TooLong,
    /// Not UTF-8: the byte (within the line) where it stops being.
    NotUtf8(usize),
}

/// Reads the next line into `buf`, never more than [`MAX_ROW_BYTES`] + 1
/// bytes of it (a longer one is [`Line::TooLong`], not read whole); `None`
/// at the end. Every JSON-lines reader of the user's data and of our
/// artifacts reads through it.
pub(crate) fn next_line<'a>(reader: &mut impl BufRead, buf: &'a mut Vec<u8>) -> std::io::Result<Option<Line<'a>>> {
    buf.clear();
    if reader.take(MAX_ROW_BYTES as u64 + 1).read_until(b'\n', buf)? == 0 {
        return Ok(None);
    }
    if buf.len() > MAX_ROW_BYTES {
        return Ok(Some(Line::TooLong));
    }
    Ok(Some(match std::str::from_utf8(buf) {
        Ok(text) => Line::Text(text.trim_end_matches(['\n', '\r'])),
        Err(e) => Line::NotUtf8(e.valid_up_to()),
    }))
}

/// Reads the JSON lines of `path` one row at a time, at most
/// [`MAX_ROW_BYTES`] each, into `T`. `what` names the file in errors (the
/// input's name: `pages`, `validation_labels`).
fn read_rows<T: DeserializeOwned>(path: &Path, what: &str) -> Result<Vec<T>, RowError> {
    let file = std::fs::File::open(path).map_err(|e| RowError(format!("{what} ({}): {e}", path.display())))?;
    let mut reader = BufReader::new(file);
    let mut rows = Vec::new();
    let mut line = Vec::new();
    for n in 1.. {
        let at = |what_happened: String| RowError(format!("{what} ({}): row {n}{what_happened}", path.display()));
        let text = match next_line(&mut reader, &mut line).map_err(|e| at(format!(": {e}")))? {
            None => break,
            Some(Line::TooLong) => {
                return Err(at(format!(
                    " is longer than {} MiB; a row is one JSON object on one line",
                    MAX_ROW_BYTES >> 20
                )))
            }
            Some(Line::NotUtf8(byte)) => return Err(at(format!(" is not UTF-8 (byte {byte})"))),
            Some(Line::Text(text)) => text,
        };
        if text.trim().is_empty() {
            return Err(at(" is empty".into()));
        }
        let mut de = serde_json::Deserializer::from_str(text);
        let row: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.inner().to_string();
            let (field, message) = match inner.strip_prefix("missing field `") {
                Some(rest) => (rest.split('`').next().unwrap_or_default().to_string(), "missing".to_string()),
                None => match inner.strip_prefix("unknown field `") {
                    Some(rest) => {
                        let name = rest.split('`').next().unwrap_or_default().to_string();
                        (name, format!("not a field of {what} rows (see docs/data.md)"))
                    }
                    None => (field, inner),
                },
            };
            let why = purpose(&field);
            let why = if why.is_empty() { String::new() } else { format!(" ({why})") };
            RowError(format!("{what} ({}): row {n}: field '{field}'{why}: {message}", path.display()))
        })?;
        de.end().map_err(|e| RowError(format!("{what} ({}): row {n}: {e}", path.display())))?;
        rows.push(row);
    }
    Ok(rows)
}

fn check_population(what: &str, path: &Path, n: usize, population: &Option<String>) -> Result<(), RowError> {
    match population.as_deref() {
        Some(ALL_POPULATION) => Err(RowError(format!(
            "{what} ({}): row {n}: field 'population': 'ALL' is every problem's; leave the field out instead",
            path.display()
        ))),
        Some("") => Err(RowError(format!(
            "{what} ({}): row {n}: field 'population' is empty; leave it out for ALL only",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// What the readers check of every row, pages and labels alike.
trait Row: DeserializeOwned {
    fn id(&self) -> &str;
    fn population(&self) -> &Option<String>;
}

impl Row for PageRow {
    fn id(&self) -> &str {
        &self.id
    }
    fn population(&self) -> &Option<String> {
        &self.population
    }
}

impl Row for LabelRow {
    fn id(&self) -> &str {
        &self.id
    }
    fn population(&self) -> &Option<String> {
        &self.population
    }
}

/// Reads rows, each population checked and the ids unique.
fn read_checked<T: Row>(path: &Path, what: &str) -> Result<Vec<T>, RowError> {
    let rows: Vec<T> = read_rows(path, what)?;
    let mut seen = HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        check_population(what, path, i + 1, r.population())?;
        if let Some(first) = seen.insert(r.id(), i + 1) {
            return Err(RowError(format!(
                "{what} ({}): rows {first} and {} have the same id '{}'",
                path.display(),
                i + 1,
                r.id()
            )));
        }
    }
    Ok(rows)
}

/// Reads a pages file; ids must be unique.
pub fn read_pages(path: &Path, what: &str) -> Result<Vec<PageRow>, RowError> {
    read_checked(path, what)
}

/// Reads a labels file; ids must be unique.
pub fn read_labels(path: &Path, what: &str) -> Result<Vec<LabelRow>, RowError> {
    read_checked(path, what)
}

/// Labels by id.
pub fn labels_by_id(labels: Vec<LabelRow>) -> BTreeMap<String, LabelRow> {
    labels.into_iter().map(|l| (l.id.clone(), l)).collect()
}

/// A page joined with its label.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    pub page: PageRow,
    pub label: LabelRow,
}

impl Example {
    pub fn id(&self) -> &str {
        &self.page.id
    }
}

/// Reads pages and labels and joins them by id, in the pages' order. Every
/// page needs its label, of the same split and population.
pub fn read_examples(
    pages: &Path,
    pages_what: &str,
    labels: &Path,
    labels_what: &str,
) -> Result<Vec<Example>, RowError> {
    let mut by_id = labels_by_id(read_labels(labels, labels_what)?);
    read_pages(pages, pages_what)?
        .into_iter()
        .map(|page| {
            let label = by_id.remove(&page.id).ok_or_else(|| {
                RowError(format!(
                    "{pages_what} ({}): page '{}' has no label in {labels_what} ({})",
                    pages.display(),
                    page.id,
                    labels.display()
                ))
            })?;
            if label.split != page.split || label.population != page.population {
                return Err(RowError(format!(
                    "'{}': the page says split {} population {}, its label split {} population {} ({pages_what} and {labels_what} are not of the same data)",
                    page.id,
                    page.split.as_str(),
                    page.population.as_deref().unwrap_or(ALL_POPULATION),
                    label.split.as_str(),
                    label.population.as_deref().unwrap_or(ALL_POPULATION),
                )));
            }
            Ok(Example { page, label })
        })
        .collect()
}

/// The reference response of a label, for SFT: an error naming the row and
/// what is needed when it is absent.
pub fn reference_response<'a>(label: &'a LabelRow, what: &str) -> Result<&'a str, RowError> {
    label.reference_response.as_deref().ok_or_else(|| {
        RowError(format!(
            "{what}: label '{}' has no 'reference_response' ({}); give every label one (dataset.import: fields.reference_response) or train it with train.grpo only",
            label.id,
            purpose("reference_response")
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::generate::{generate, Counts};

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn every_stock_arithmetic_row_reads_back_as_the_typed_rows_and_writes_the_same_bytes() {
        let rows = generate(
            1,
            &Counts { train: 20, validation: 5, test_id50: 5, test_ood100: 5, warmstart: 4, pretrain: 0, drills: 0 },
        )
        .unwrap();
        for r in &rows {
            let page = serde_json::to_string(&r.page()).unwrap();
            let label = serde_json::to_string(&r.label()).unwrap();
            let p: PageRow = serde_json::from_str(&page).unwrap();
            let l: LabelRow = serde_json::from_str(&label).unwrap();
            assert_eq!(serde_json::to_string(&p).unwrap(), page);
            assert_eq!(l.warmstart, r.warmstart);
            assert_eq!(l.reference_response.as_deref(), Some(r.reference_response.as_str()));
            assert_eq!(l.problem, serde_json::to_value(r.problem).unwrap());
        }
    }

    #[test]
    fn a_missing_or_ill_typed_field_names_the_file_row_field_and_what_it_selects() {
        let dir = tempfile::tempdir().unwrap();
        let ok = r#"{"id":"a","split":"train","problem":{"answer":"1"},"warmstart":false}"#;
        let p =
            write(dir.path(), "l", &format!("{ok}\n{}\n", r#"{"id":"b","split":"train","problem":{"answer":"2"}}"#));
        let e = read_labels(&p, "labels").unwrap_err().0;
        assert!(e.contains("row 2") && e.contains("field 'warmstart'") && e.contains("missing"), "{e}");
        assert!(e.contains("warm-start SFT set"), "{e}");
        let p =
            write(dir.path(), "l2", &format!("{}\n", r#"{"id":"b","split":"train","problem":{},"warmstart":"yes"}"#));
        let e = read_labels(&p, "labels").unwrap_err().0;
        assert!(e.contains("row 1") && e.contains("field 'warmstart'") && e.contains("expected a boolean"), "{e}");
        let p = write(dir.path(), "p", "{\"id\":\"a\",\"split\":\"train\",\"statment\":\"x\"}\n");
        let e = read_pages(&p, "pages").unwrap_err().0;
        assert!(e.contains("field 'statment'") && e.contains("not a field"), "{e}");
        let p =
            write(dir.path(), "p2", "{\"id\":\"a\",\"split\":\"train\",\"statement\":\"x\",\"population\":\"ALL\"}\n");
        assert!(read_pages(&p, "pages").unwrap_err().0.contains("'ALL'"));
        let p = write(dir.path(), "p3", "{\"id\":\"a\",\"split\":\"train\",\"statement\":\"x\"}\n{\"id\":\"a\",\"split\":\"train\",\"statement\":\"y\"}\n");
        assert!(read_pages(&p, "pages").unwrap_err().0.contains("rows 1 and 2 have the same id 'a'"));
        let p = dir.path().join("bad");
        std::fs::write(&p, b"{\"id\":\"a\xff\",\"split\":\"train\",\"statement\":\"x\"}\n").unwrap();
        assert!(read_pages(&p, "pages").unwrap_err().0.contains("row 1 is not UTF-8"));
    }

    #[test]
    fn a_page_needs_its_label_of_the_same_split_and_population() {
        let dir = tempfile::tempdir().unwrap();
        let pages =
            write(dir.path(), "p", "{\"id\":\"a\",\"split\":\"train\",\"statement\":\"x\",\"population\":\"hard\"}\n");
        let labels = write(dir.path(), "l", "{\"id\":\"a\",\"split\":\"train\",\"problem\":{},\"warmstart\":false}\n");
        let e = read_examples(&pages, "pages", &labels, "labels").unwrap_err().0;
        assert!(e.contains("population hard") && e.contains("population ALL"), "{e}");
        let labels = write(dir.path(), "l2", "{\"id\":\"b\",\"split\":\"train\",\"problem\":{},\"warmstart\":false}\n");
        let e = read_examples(&pages, "pages", &labels, "labels").unwrap_err().0;
        assert!(e.contains("page 'a' has no label"), "{e}");
    }
}
