//! The user's data files, as `dataset.import` and `dataset.hub` read them:
//! JSON lines, a JSON array of objects, CSV with a header row, or Parquet.
//! Each row becomes named values (only the columns asked for), with where it
//! came from (`data/train.jsonl row 3`) for every error about it.
//!
//! The files are the user's or a download, so hostile until checked: read
//! from a real file only (no link on the way), a row at most
//! [`MAX_ROW_BYTES`], a JSON array file at most [`MAX_JSON_BYTES`], text
//! that is UTF-8, a CSV row as long as its header.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};

use serde_json::Value;

pub use super::rows::MAX_ROW_BYTES;
use super::rows::{next_line, Line};

/// The largest JSON-array file read whole (256 MiB); JSON lines, CSV and
/// Parquet are read a row at a time.
pub const MAX_JSON_BYTES: u64 = 256 << 20;

/// How a data file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TableFormat {
    /// One JSON object per line (`.jsonl`, `.ndjson`).
    Jsonl,
    /// One JSON array of objects (`.json`).
    Json,
    /// A header row, then one row per problem (RFC 4180; `.csv`).
    Csv,
    /// Apache Parquet (`.parquet`), as Hugging Face datasets ship.
    Parquet,
}

impl TableFormat {
    /// The format a file name's extension says.
    pub fn of(path: &str) -> Option<TableFormat> {
        let ext = path.rsplit_once('.')?.1.to_ascii_lowercase();
        match ext.as_str() {
            "jsonl" | "ndjson" => Some(TableFormat::Jsonl),
            "json" => Some(TableFormat::Json),
            "csv" => Some(TableFormat::Csv),
            "parquet" => Some(TableFormat::Parquet),
            _ => None,
        }
    }
}

/// One row of a data file: where it is, and the values of the columns asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceRow {
    /// `FILE row N` (N counts data rows from 1, a CSV header aside).
    pub at: String,
    pub values: BTreeMap<String, Value>,
}

/// Why a data file's rows did not read.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// Its content: the message names the file, the row and the column.
    #[error("{0}")]
    Invalid(String),
}

/// Reads the rows of a file the caller opened (and checked: a user's file
/// through `fsx::open_user_file`, a Hub download re-hashed against its
/// announced hash), keeping the columns `columns`; `rel` names it in errors.
/// A column asked for that a row lacks is an error naming the file, row and
/// column (a `null` value is kept as null: the caller decides).
pub fn read_file(file: File, rel: &str, format: TableFormat, columns: &[&str]) -> Result<Vec<SourceRow>, TableError> {
    match format {
        TableFormat::Jsonl => jsonl(file, rel, columns),
        TableFormat::Json => json(file, rel, columns),
        TableFormat::Csv => csv_rows(file, rel, columns),
        TableFormat::Parquet => parquet_rows(file, rel, columns),
    }
    .map_err(TableError::Invalid)
}

fn pick(rel: &str, n: usize, object: &serde_json::Map<String, Value>, columns: &[&str]) -> Result<SourceRow, String> {
    let at = format!("{rel} row {n}");
    let mut values = BTreeMap::new();
    for c in columns {
        let v = object.get(*c).ok_or_else(|| {
            let mut have: Vec<&str> = object.keys().map(String::as_str).collect();
            have.sort_unstable();
            format!(
                "{at}: no field '{c}'{} (its fields: {})",
                crate::suggest::did_you_mean(c, have.iter().copied()),
                have.join(", ")
            )
        })?;
        values.insert(c.to_string(), v.clone());
    }
    Ok(SourceRow { at, values })
}

fn jsonl(file: File, rel: &str, columns: &[&str]) -> Result<Vec<SourceRow>, String> {
    let mut reader = BufReader::new(file);
    let mut out = Vec::new();
    let mut line = Vec::new();
    let mut n = 0;
    loop {
        let text = match next_line(&mut reader, &mut line).map_err(|e| format!("{rel} row {}: {e}", n + 1))? {
            None => break,
            Some(Line::TooLong) => {
                return Err(format!(
                    "{rel} row {} is longer than {} MiB (a JSON-lines row is one object on one line)",
                    n + 1,
                    MAX_ROW_BYTES >> 20
                ))
            }
            Some(Line::NotUtf8(byte)) => {
                return Err(format!("{rel} row {} is not UTF-8 (at byte {byte} of the row)", n + 1))
            }
            // A blank line (often the last one) is not a row.
            Some(Line::Text(text)) if text.trim().is_empty() => continue,
            Some(Line::Text(text)) => text,
        };
        n += 1;
        let value: Value = serde_json::from_str(text).map_err(|e| format!("{rel} row {n} is not JSON: {e}"))?;
        let Value::Object(object) = value else {
            return Err(format!("{rel} row {n} is not a JSON object"));
        };
        out.push(pick(rel, n, &object, columns)?);
    }
    Ok(out)
}

fn json(file: File, rel: &str, columns: &[&str]) -> Result<Vec<SourceRow>, String> {
    use crate::fsread::{read_opened, OpenedReadError};
    let bytes = read_opened(file, MAX_JSON_BYTES).map_err(|e| match e {
        OpenedReadError::TooLarge(len) => format!(
            "{rel} is {len} bytes, over the {} MiB a JSON array file may be; write it as JSON lines (.jsonl), read a row at a time",
            MAX_JSON_BYTES >> 20
        ),
        OpenedReadError::Io(e) => format!("{rel}: {e}"),
    })?;
    let text = std::str::from_utf8(&bytes).map_err(|e| format!("{rel} is not UTF-8 (at byte {})", e.valid_up_to()))?;
    let value: Value = serde_json::from_str(text).map_err(|e| format!("{rel} is not JSON: {e}"))?;
    let Value::Array(rows) = value else {
        return Err(format!("{rel}: expected a JSON array of objects (one per problem)"));
    };
    rows.iter()
        .enumerate()
        .map(|(i, row)| match row {
            Value::Object(object) => pick(rel, i + 1, object, columns),
            _ => Err(format!("{rel} row {}: not a JSON object", i + 1)),
        })
        .collect()
}

/// What [`RowBounded`] says when a record passes its bound.
const ROW_PAST_BOUND: &str = "a CSV record past its bound";

/// The file as the CSV parser reads it, but never more than a row's bound
/// (and the parser's read-ahead) past the start of the record it is parsing:
/// the parser holds a whole record before it can be measured, so one endless
/// row would otherwise be read into memory whole.
struct RowBounded<R> {
    inner: R,
    read: u64,
    record_start: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: Read> Read for RowBounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // The parser reads ahead 8 KiB at a time; 64 KiB of slack covers it.
        let allowed = self.record_start.get() + MAX_ROW_BYTES as u64 + (64 << 10);
        if self.read >= allowed {
            return Err(std::io::Error::other(ROW_PAST_BOUND));
        }
        let cap = (allowed - self.read).min(buf.len() as u64) as usize;
        let n = self.inner.read(&mut buf[..cap])?;
        self.read += n as u64;
        Ok(n)
    }
}

fn past_bound(e: &csv::Error) -> bool {
    matches!(e.kind(), csv::ErrorKind::Io(io) if io.to_string() == ROW_PAST_BOUND)
}

fn csv_rows(file: impl Read, rel: &str, columns: &[&str]) -> Result<Vec<SourceRow>, String> {
    let record_start = std::rc::Rc::new(std::cell::Cell::new(0));
    let bounded = RowBounded { inner: file, read: 0, record_start: record_start.clone() };
    let mut reader = csv::ReaderBuilder::new().has_headers(true).flexible(false).from_reader(bounded);
    let too_long = |n: usize| format!("{rel} row {n} is longer than {} MiB", MAX_ROW_BYTES >> 20);
    let headers = reader
        .byte_headers()
        .map_err(|e| {
            if past_bound(&e) {
                format!("{rel}: the header row is longer than {} MiB", MAX_ROW_BYTES >> 20)
            } else {
                csv_error(rel, e)
            }
        })?
        .clone();
    record_start.set(reader.position().byte());
    let names: Vec<String> = headers
        .iter()
        .map(|h| String::from_utf8(h.to_vec()).map_err(|_| format!("{rel}: the header row is not UTF-8")))
        .collect::<Result<_, _>>()?;
    let mut index = Vec::new();
    for c in columns {
        let i = names.iter().position(|n| n == c).ok_or_else(|| {
            format!(
                "{rel}: no column '{c}'{} (its header: {})",
                crate::suggest::did_you_mean(c, names.iter().map(String::as_str)),
                names.join(", ")
            )
        })?;
        index.push((c.to_string(), i));
    }
    let mut out = Vec::new();
    let mut record = csv::ByteRecord::new();
    let mut n = 0;
    while reader.read_byte_record(&mut record).map_err(|e| {
        if past_bound(&e) {
            too_long(n + 1)
        } else {
            csv_error(rel, e)
        }
    })? {
        n += 1;
        record_start.set(reader.position().byte());
        if record.as_slice().len() > MAX_ROW_BYTES {
            return Err(too_long(n));
        }
        let mut values = BTreeMap::new();
        for (name, i) in &index {
            let raw = record.get(*i).unwrap_or_default();
            let text = std::str::from_utf8(raw)
                .map_err(|e| format!("{rel} row {n}: column '{name}' is not UTF-8 (at byte {})", e.valid_up_to()))?;
            values.insert(name.clone(), Value::String(text.to_string()));
        }
        out.push(SourceRow { at: format!("{rel} row {n}"), values });
    }
    Ok(out)
}

fn csv_error(rel: &str, e: csv::Error) -> String {
    match e.kind() {
        csv::ErrorKind::UnequalLengths { pos, expected_len, len } => {
            let row = pos.as_ref().map(|p| p.record()).unwrap_or(0);
            let line = pos.as_ref().map(|p| p.line()).unwrap_or(0);
            format!("{rel} row {row} (line {line}) has {len} fields, but the header has {expected_len}: a ragged row")
        }
        csv::ErrorKind::Utf8 { pos, .. } => {
            let line = pos.as_ref().map(|p| p.line()).unwrap_or(0);
            format!("{rel} line {line} is not UTF-8")
        }
        _ => format!("{rel}: {e}"),
    }
}

/// A Parquet float as JSON. NaN and the infinities (what pandas writes for a
/// missing number) have no JSON form: one is refused naming what it is,
/// never read as `null`, which the file does not hold.
fn finite(rel: &str, n: usize, column: &str, x: f64) -> Result<Value, String> {
    serde_json::Number::from_f64(x).map(Value::Number).ok_or_else(|| {
        let what = crate::docfile::non_finite_spelled(x);
        format!("{rel} row {n}: column '{column}' is {what}, which no field of a problem can be (a missing number?)")
    })
}

fn parquet_rows(file: File, rel: &str, columns: &[&str]) -> Result<Vec<SourceRow>, String> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;

    let reader = SerializedFileReader::new(file).map_err(|e| format!("{rel} is not a readable Parquet file: {e}"))?;
    let schema = reader.metadata().file_metadata().schema_descr();
    let names: Vec<String> = schema.root_schema().get_fields().iter().map(|f| f.name().to_string()).collect();
    for c in columns {
        if !names.iter().any(|n| n == c) {
            return Err(format!(
                "{rel}: no column '{c}'{} (its columns: {})",
                crate::suggest::did_you_mean(c, names.iter().map(String::as_str)),
                names.join(", ")
            ));
        }
    }
    // Read only the columns asked for: a projection of the file's schema.
    let wanted: Vec<parquet::schema::types::TypePtr> =
        schema.root_schema().get_fields().iter().filter(|f| columns.contains(&f.name())).cloned().collect();
    let projection = parquet::schema::types::Type::group_type_builder(schema.root_schema().name())
        .with_fields(wanted)
        .build()
        .map_err(|e| format!("{rel}: {e}"))?;
    let rows = reader.get_row_iter(Some(projection)).map_err(|e| format!("{rel}: {e}"))?;
    let mut out = Vec::new();
    for (i, row) in rows.enumerate() {
        let n = i + 1;
        let row = row.map_err(|e| format!("{rel} row {n}: {e}"))?;
        let mut values = BTreeMap::new();
        let mut size = 0usize;
        for (name, field) in row.get_column_iter() {
            let v = match field {
                Field::Null => Value::Null,
                Field::Bool(b) => Value::Bool(*b),
                Field::Byte(x) => Value::from(*x),
                Field::Short(x) => Value::from(*x),
                Field::Int(x) => Value::from(*x),
                Field::Long(x) => Value::from(*x),
                Field::UByte(x) => Value::from(*x),
                Field::UShort(x) => Value::from(*x),
                Field::UInt(x) => Value::from(*x),
                Field::ULong(x) => Value::from(*x),
                Field::Float(x) => finite(rel, n, name, f64::from(*x))?,
                Field::Double(x) => finite(rel, n, name, *x)?,
                Field::Str(s) => {
                    size += s.len();
                    Value::String(s.clone())
                }
                _ => {
                    return Err(format!(
                        "{rel} row {n}: column '{name}' holds a value that is not text, a number or a bool (a list, map, struct, date, decimal or bytes); a mapped column must be one of those"
                    ))
                }
            };
            values.insert(name.clone(), v);
        }
        if size > MAX_ROW_BYTES {
            return Err(format!("{rel} row {n} is longer than {} MiB", MAX_ROW_BYTES >> 20));
        }
        out.push(SourceRow { at: format!("{rel} row {n}"), values });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CSV parser holds a whole record before it can be measured: a file
    /// of one endless row is refused once the row passes its bound, not held
    /// in memory whole (before, this read without end).
    #[test]
    fn an_endless_csv_row_is_refused_at_its_bound_not_held_whole() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let endless = b"question,answer\n\"".chain(std::io::repeat(b'x'));
            let _ = tx.send(csv_rows(endless, "endless.csv", &["question"]));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("the row was read without end");
        let e = got.unwrap_err();
        assert!(e.contains("endless.csv row 1 is longer than 4 MiB"), "{e}");
        // An endless header row too.
        let e = csv_rows(std::io::repeat(b'h'), "header.csv", &["question"]).unwrap_err();
        assert!(e.contains("header.csv: the header row is longer than 4 MiB"), "{e}");
    }
}
