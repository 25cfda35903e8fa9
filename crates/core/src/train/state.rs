//! Full resumable training state: one safetensors file (model, AdamW moments)
//! whose metadata holds the rest as JSON (step, scheduler position, prompt
//! order and cursor, consumed rollout ids, history), gzip level 1, written
//! atomically (temp file, fsync, rename).

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::Path;

use serde_json::Value;

/// A raw tensor: dtype name (safetensors'), shape, little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct RawTensor {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// A loaded state file.
#[derive(Debug, Clone, PartialEq)]
pub struct StateFile {
    pub meta: Value,
    pub tensors: BTreeMap<String, RawTensor>,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

const META_KEY: &str = "orchestrate_state";

/// Writes a state atomically: f32 tensors (name → shape, values) plus `meta`
/// as JSON (a trainer's is its [`TrainingMetrics`](crate::train::metrics::TrainingMetrics)).
pub fn write_state(
    path: &Path,
    meta: &impl serde::Serialize,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
) -> Result<(), StateError> {
    let shapes: Vec<(String, Vec<usize>)> = tensors.iter().map(|(n, s, _)| (n.clone(), s.clone())).collect();
    let by_name: HashMap<&str, &[f32]> = tensors.iter().map(|(n, _, v)| (n.as_str(), v.as_slice())).collect();
    write_state_streamed(path, meta, &shapes, |name, out| write_f32_le(by_name[name], out))
}

/// Writes f32 values as little-endian bytes, a block at a time (never a copy
/// of the whole tensor).
pub fn write_f32_le(values: &[f32], out: &mut dyn Write) -> std::io::Result<()> {
    let mut block = Vec::with_capacity(1 << 16);
    for chunk in values.chunks(1 << 14) {
        block.clear();
        for x in chunk {
            block.extend_from_slice(&x.to_le_bytes());
        }
        out.write_all(&block)?;
    }
    Ok(())
}

/// Counts what goes through, so a tensor that wrote other than its size is caught.
struct Counted<'a> {
    inner: &'a mut dyn Write,
    bytes: usize,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The safetensors header of a state: what `safetensors::serialize` writes
/// (tensors by descending dtype alignment, then name; offsets in that order;
/// the JSON padded with spaces to a multiple of 8), and the tensors in file order.
/// A state's header bytes, and each tensor's name and byte size in file order.
type Header = (Vec<u8>, Vec<(String, usize)>);

fn header(meta: &impl serde::Serialize, shapes: &[(String, Vec<usize>)]) -> Result<Header, String> {
    use safetensors::tensor::{Metadata, TensorInfo};
    let mut sorted: Vec<&(String, Vec<usize>)> = shapes.iter().collect();
    // Every state tensor is F32: the dtype order is the name order.
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let (mut infos, mut order, mut offset) = (Vec::new(), Vec::new(), 0usize);
    for (name, shape) in sorted {
        let n = shape.iter().product::<usize>() * 4;
        infos.push((
            name.clone(),
            TensorInfo { dtype: safetensors::Dtype::F32, shape: shape.clone(), data_offsets: (offset, offset + n) },
        ));
        order.push((name.clone(), n));
        offset += n;
    }
    let mut metadata = HashMap::new();
    // Through a JSON value: its keys are written sorted, whatever order the
    // type declares its fields in (the states written so far read the same).
    let meta = serde_json::to_value(meta).map_err(|e| format!("the state's metadata: {e}"))?;
    metadata.insert(META_KEY.to_string(), meta.to_string());
    let header = Metadata::new(Some(metadata), infos).map_err(|e| e.to_string())?;
    let mut bytes = serde_json::to_string(&header).map_err(|e| e.to_string())?.into_bytes();
    bytes.resize(bytes.len().next_multiple_of(8), b' ');
    Ok((bytes, order))
}

/// Writes a state atomically, streamed: the header first, then each tensor's
/// little-endian f32 bytes as `emit(name, out)` writes them, straight into
/// the gzip stream, so no copy of the whole state is ever in memory (a 0.5B
/// model's state is 5.9 GB of f32). The bytes are those of
/// `safetensors::serialize` then gzip level 1, as before (the committed
/// packs' states read, and a state written again is the same object).
pub fn write_state_streamed(
    path: &Path,
    meta: &impl serde::Serialize,
    shapes: &[(String, Vec<usize>)],
    mut emit: impl FnMut(&str, &mut dyn Write) -> std::io::Result<()>,
) -> Result<(), StateError> {
    let io = |context: String| move |source| StateError::Io { context, source };
    let invalid = |message: String| StateError::Invalid { path: path.display().to_string(), message };
    let (head, order) = header(meta, shapes).map_err(invalid)?;
    let tmp = path.with_extension("partial");
    let written = (|| -> Result<(), StateError> {
        // A link there is an error, never written through.
        let file = crate::store::fsx::open_truncate(&tmp).map_err(io(format!("creating {}", tmp.display())))?;
        let mut gz = flate2::write::GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::new(1));
        gz.write_all(&(head.len() as u64).to_le_bytes()).map_err(io(format!("writing {}", tmp.display())))?;
        gz.write_all(&head).map_err(io(format!("writing {}", tmp.display())))?;
        for (name, size) in &order {
            let mut out = Counted { inner: &mut gz, bytes: 0 };
            emit(name, &mut out).map_err(io(format!("writing tensor {name} into {}", tmp.display())))?;
            if out.bytes != *size {
                return Err(invalid(format!("tensor {name}: {} bytes written for a size of {size}", out.bytes)));
            }
        }
        let file = gz.finish().map_err(io(format!("writing {}", tmp.display())))?;
        let file = file
            .into_inner()
            .map_err(|e| StateError::Io { context: format!("writing {}", tmp.display()), source: e.into_error() })?;
        file.sync_all().map_err(io(format!("syncing {}", tmp.display())))
    })();
    if let Err(e) = written {
        // Never a half-written state left beside the real one.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).map_err(io(format!("publishing {}", path.display())))
}

/// The largest state header read (safetensors' own bound).
const MAX_HEADER_BYTES: u64 = crate::model::MAX_SAFETENSORS_HEADER;

/// A tensor as a state's header describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorHead {
    pub name: String,
    /// safetensors' dtype name (`F32` for every tensor a state holds).
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Its size in bytes.
    pub bytes: usize,
}

/// A state file opened for reading: its metadata and tensor list are read
/// (so a caller can refuse a state of another run before reading any of its
/// gigabytes); its tensors are then read one by one, straight from the gzip
/// stream into wherever the caller puts them ([`StateReader::read_tensors`]).
pub struct StateReader {
    path: std::path::PathBuf,
    gz: flate2::read::GzDecoder<std::io::BufReader<std::fs::File>>,
    meta: Value,
    heads: Vec<TensorHead>,
}

impl StateReader {
    pub fn open(path: &Path) -> Result<StateReader, StateError> {
        let invalid = |message: String| StateError::Invalid { path: path.display().to_string(), message };
        let file = std::fs::File::open(path)
            .map_err(|source| StateError::Io { context: format!("opening {}", path.display()), source })?;
        let mut gz = flate2::read::GzDecoder::new(std::io::BufReader::new(file));
        let mut n = [0u8; 8];
        gz.read_exact(&mut n).map_err(|e| invalid(format!("not a gzip state file: {e}")))?;
        let n = u64::from_le_bytes(n);
        if n > MAX_HEADER_BYTES {
            return Err(invalid(format!("a header of {n} bytes, over the {MAX_HEADER_BYTES} allowed")));
        }
        let mut head = vec![0u8; n as usize];
        gz.read_exact(&mut head).map_err(|e| invalid(format!("the header is cut short: {e}")))?;
        let head = std::str::from_utf8(&head).map_err(|e| invalid(format!("the header is not UTF-8: {e}")))?;
        let header: safetensors::tensor::Metadata =
            serde_json::from_str(head).map_err(|e| invalid(format!("the header does not read: {e}")))?;
        let meta_text = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get(META_KEY))
            .ok_or_else(|| invalid("no orchestrate state metadata".into()))?
            .clone();
        let meta: Value = serde_json::from_str(&meta_text).map_err(|e| invalid(e.to_string()))?;
        let mut infos: Vec<(String, &safetensors::tensor::TensorInfo)> = header.tensors().into_iter().collect();
        infos.sort_by_key(|(_, info)| info.data_offsets);
        let (mut heads, mut at) = (Vec::with_capacity(infos.len()), 0usize);
        for (name, info) in infos {
            let (start, end) = info.data_offsets;
            if start != at || end < start {
                return Err(invalid(format!("tensor {name}: its bytes are not where the header says")));
            }
            at = end;
            heads.push(TensorHead {
                name,
                dtype: format!("{:?}", info.dtype),
                shape: info.shape.clone(),
                bytes: end - start,
            });
        }
        Ok(StateReader { path: path.to_path_buf(), gz, meta, heads })
    }

    /// The JSON the state holds beside its tensors.
    pub fn meta(&self) -> &Value {
        &self.meta
    }

    /// The tensors, in file order.
    pub fn heads(&self) -> &[TensorHead] {
        &self.heads
    }

    /// Reads every tensor in file order: `take(head, bytes)` must read exactly
    /// `head.bytes` bytes from `bytes`, which ends there. A tensor cut short,
    /// one its taker did not read whole, or bytes after the last tensor are an
    /// error naming the file and the tensor.
    pub fn read_tensors(
        mut self,
        mut take: impl FnMut(&TensorHead, &mut dyn Read) -> std::io::Result<()>,
    ) -> Result<(), StateError> {
        let path = self.path.display().to_string();
        let invalid = |message: String| StateError::Invalid { path: path.clone(), message };
        for head in &self.heads {
            let mut part = (&mut self.gz).take(head.bytes as u64);
            take(head, &mut part).map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => invalid(format!("tensor {} is cut short: {e}", head.name)),
                _ => invalid(format!("tensor {}: {e}", head.name)),
            })?;
            if part.limit() != 0 {
                return Err(invalid(format!(
                    "tensor {}: {} of its {} bytes were read",
                    head.name,
                    head.bytes as u64 - part.limit(),
                    head.bytes
                )));
            }
        }
        self.check_end()
    }

    /// After the last tensor: nothing may follow it, and the gzip stream must end well.
    fn check_end(&mut self) -> Result<(), StateError> {
        let invalid = |message: String| StateError::Invalid { path: self.path.display().to_string(), message };
        let mut rest = [0u8; 1];
        match self.gz.read(&mut rest) {
            Ok(0) => Ok(()),
            Ok(_) => Err(invalid("bytes after the last tensor".into())),
            Err(e) => Err(invalid(format!("not a gzip state file: {e}"))),
        }
    }
}

/// Reads a whole state file written by [`write_state`] into memory (every
/// tensor's bytes; for comparing two states). A trainer restoring a state
/// reads it into its own tensors through [`StateReader`] instead.
pub fn read_state(path: &Path) -> Result<StateFile, StateError> {
    let reader = StateReader::open(path)?;
    let meta = reader.meta().clone();
    let mut tensors = BTreeMap::new();
    reader.read_tensors(|head, bytes| {
        let mut all = vec![0u8; head.bytes];
        bytes.read_exact(&mut all)?;
        tensors
            .insert(head.name.clone(), RawTensor { dtype: head.dtype.clone(), shape: head.shape.clone(), bytes: all });
        Ok(())
    })?;
    Ok(StateFile { meta, tensors })
}

/// The first difference between two states, field by field and tensor by
/// tensor, or `None` when they are identical. Fields named in `ignore`
/// (wall-clock times, which are never part of the comparable state) are skipped.
pub fn first_difference(a: &StateFile, b: &StateFile, ignore: &[&str]) -> Option<String> {
    if let Some(d) = json_difference("", &a.meta, &b.meta, ignore) {
        return Some(d);
    }
    for name in a.tensors.keys().chain(b.tensors.keys()) {
        match (a.tensors.get(name), b.tensors.get(name)) {
            (Some(x), Some(y)) if x == y => {}
            (Some(x), Some(y)) if x.shape != y.shape || x.dtype != y.dtype => {
                return Some(format!("tensor {name}: {} {:?} vs {} {:?}", x.dtype, x.shape, y.dtype, y.shape));
            }
            (Some(x), Some(y)) => {
                let i = x.bytes.iter().zip(&y.bytes).position(|(p, q)| p != q).unwrap_or(0) / 4;
                let at = |t: &RawTensor| {
                    let mut w = [0u8; 4];
                    w.copy_from_slice(&t.bytes[i * 4..i * 4 + 4]);
                    f32::from_le_bytes(w)
                };
                return Some(format!("tensor {name}: element {i} differs ({} vs {})", at(x), at(y)));
            }
            (Some(_), None) => return Some(format!("tensor {name} only in the first state")),
            (None, Some(_)) => return Some(format!("tensor {name} only in the second state")),
            (None, None) => {}
        }
    }
    None
}

/// The most tensor bytes (both states together) [`first_difference_in_files`]
/// reads into memory, for states whose tensors are not in name order.
pub const MAX_COMPARED_IN_MEMORY: u64 = 1 << 30;

/// [`first_difference`] of two state files, read side by side a block at a
/// time: the same answer, holding two blocks of tensor bytes where reading
/// both states whole held both (at Qwen2.5-0.5B's shapes, 5.9 GB each; at
/// 4B, tens of GB). The states this module writes list their tensors in name
/// order, the order [`first_difference`] looks in; two states of the same
/// tensors that are equal are read to their ends, so "no difference" means
/// both files are whole. A state in another order (none orchestrate wrote) is
/// compared in memory if both together hold at most [`MAX_COMPARED_IN_MEMORY`]
/// bytes of tensors, and refused otherwise.
pub fn first_difference_in_files(a: &Path, b: &Path, ignore: &[&str]) -> Result<Option<String>, StateError> {
    first_difference_in_readers(StateReader::open(a)?, StateReader::open(b)?, ignore)
}

/// [`first_difference_in_files`] of two states already opened (a caller that
/// also reports from a header need not read it twice).
pub fn first_difference_in_readers(
    mut ra: StateReader,
    mut rb: StateReader,
    ignore: &[&str],
) -> Result<Option<String>, StateError> {
    if let Some(d) = json_difference("", &ra.meta, &rb.meta, ignore) {
        return Ok(Some(d));
    }
    let in_name_order = |r: &StateReader| r.heads.windows(2).all(|w| w[0].name < w[1].name);
    if let Some(r) = [&ra, &rb].into_iter().find(|r| !in_name_order(r)) {
        let bytes: u64 = ra.heads.iter().chain(&rb.heads).map(|h| h.bytes as u64).sum();
        if bytes > MAX_COMPARED_IN_MEMORY {
            return Err(StateError::Invalid {
                path: r.path.display().to_string(),
                message: format!(
                    "its tensors are not in name order (orchestrate writes them in name order), and the two states \
                     hold {bytes} bytes of tensors, over the {MAX_COMPARED_IN_MEMORY} compared in memory"
                ),
            });
        }
        return Ok(first_difference(&read_state(&ra.path)?, &read_state(&rb.path)?, ignore));
    }
    // The first tensor of another shape or dtype, or in one state only, as
    // `first_difference` finds it, from the headers alone; the tensors of the
    // first state before it are compared byte by byte.
    let theirs: HashMap<&str, &TensorHead> = rb.heads.iter().map(|h| (h.name.as_str(), h)).collect();
    let (mut structural, mut compared) = (None, ra.heads.len());
    for (i, x) in ra.heads.iter().enumerate() {
        let differs = match theirs.get(x.name.as_str()) {
            None => Some(format!("tensor {} only in the first state", x.name)),
            Some(y) if y.shape != x.shape || y.dtype != x.dtype => {
                Some(format!("tensor {}: {} {:?} vs {} {:?}", x.name, x.dtype, x.shape, y.dtype, y.shape))
            }
            Some(_) => None,
        };
        if differs.is_some() {
            (structural, compared) = (differs, i);
            break;
        }
    }
    if structural.is_none() {
        let ours: std::collections::HashSet<&str> = ra.heads.iter().map(|h| h.name.as_str()).collect();
        structural = rb
            .heads
            .iter()
            .find(|h| !ours.contains(h.name.as_str()))
            .map(|h| format!("tensor {} only in the second state", h.name));
    }
    let cut = |r: &StateReader, name: &str, e: std::io::Error| StateError::Invalid {
        path: r.path.display().to_string(),
        message: format!("tensor {name} is cut short: {e}"),
    };
    let (mut xs, mut ys) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    let mut j = 0;
    for x in &ra.heads[..compared] {
        // The second state's tensors the first does not have are read past.
        while rb.heads[j].name != x.name {
            let head = &rb.heads[j];
            let skipped = std::io::copy(&mut (&mut rb.gz).take(head.bytes as u64), &mut std::io::sink());
            match skipped {
                Ok(n) if n == head.bytes as u64 => j += 1,
                Ok(_) => return Err(cut(&rb, &head.name, std::io::ErrorKind::UnexpectedEof.into())),
                Err(e) => return Err(cut(&rb, &head.name, e)),
            }
        }
        j += 1;
        let mut offset = 0usize;
        while offset < x.bytes {
            let n = (x.bytes - offset).min(xs.len());
            ra.gz.read_exact(&mut xs[..n]).map_err(|e| cut(&ra, &x.name, e))?;
            rb.gz.read_exact(&mut ys[..n]).map_err(|e| cut(&rb, &x.name, e))?;
            if let Some(p) = xs[..n].iter().zip(&ys[..n]).position(|(p, q)| p != q) {
                let i = (offset + p) / 4;
                let start = i * 4 - offset;
                let what = match (xs.get(start..start + 4), ys.get(start..start + 4)) {
                    (Some(u), Some(v)) if start + 4 <= n => {
                        let f = |w: &[u8]| f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                        format!("element {i} differs ({} vs {})", f(u), f(v))
                    }
                    _ => format!("byte {} differs", offset + p),
                };
                return Ok(Some(format!("tensor {}: {what}", x.name)));
            }
            offset += n;
        }
    }
    if structural.is_none() {
        // Equal: nothing may follow the last tensor in either file.
        ra.check_end()?;
        rb.check_end()?;
    }
    Ok(structural)
}

/// The first difference between two JSON documents, as a dotted path with
/// both values (`field history[3].mean_reward: 0.25 vs 0.5`), or `None` when equal.
pub fn json_first_difference(a: &Value, b: &Value) -> Option<String> {
    json_difference("", a, b, &[])
}

fn json_difference(path: &str, a: &Value, b: &Value, ignore: &[&str]) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                if ignore.contains(&k.as_str()) {
                    continue;
                }
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => {
                        if let Some(d) = json_difference(&p, u, v, ignore) {
                            return Some(d);
                        }
                    }
                    _ => return Some(format!("field {p} is present in only one state")),
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Some(format!("field {path}: {} entries vs {}", x.len(), y.len()));
            }
            x.iter().zip(y).enumerate().find_map(|(i, (u, v))| json_difference(&format!("{path}[{i}]"), u, v, ignore))
        }
        _ if a == b => None,
        _ => Some(format!("field {path}: {a} vs {b}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn states_round_trip_and_the_first_difference_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.gz"), dir.path().join("b.gz"));
        let meta = json!({"step": 3, "history": [{"loss": 1.5, "seconds": 2.0}]});
        let tensors = vec![("w".to_string(), vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0])];
        write_state(&a, &meta, &tensors).unwrap();
        write_state(&b, &json!({"step": 3, "history": [{"loss": 1.5, "seconds": 9.0}]}), &tensors).unwrap();
        let (sa, sb) = (read_state(&a).unwrap(), read_state(&b).unwrap());
        assert_eq!(sa.meta, meta);
        assert_eq!(first_difference(&sa, &sb, &["seconds"]), None);
        assert_eq!(first_difference(&sa, &sb, &[]).unwrap(), "field history[0].seconds: 2.0 vs 9.0");
        let c = dir.path().join("c.gz");
        write_state(&c, &meta, &[("w".to_string(), vec![2, 2], vec![1.0f32, 2.0, 3.5, 4.0])]).unwrap();
        assert_eq!(
            first_difference(&sa, &read_state(&c).unwrap(), &[]).unwrap(),
            "tensor w: element 2 differs (3 vs 3.5)"
        );
    }

    /// Two state files compared side by side, a block at a time, give the
    /// answer reading both whole gives, in every way two states can differ.
    #[test]
    fn states_compared_side_by_side_give_the_in_memory_answer() {
        let dir = tempfile::tempdir().unwrap();
        let big: Vec<f32> = (0..50_000).map(|i| i as f32).collect();
        let mut big_changed = big.clone();
        big_changed[40_000] = -1.0;
        let t = |name: &str, shape: Vec<usize>, values: Vec<f32>| (name.to_string(), shape, values);
        let base =
            vec![t("a", vec![2], vec![1.0, 2.0]), t("big", vec![50_000], big.clone()), t("c", vec![2], vec![5.0, 6.0])];
        let meta = json!({"step": 3, "history": [{"loss": 1.5, "seconds": 2.0}]});
        type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;
        let cases: Vec<(&str, serde_json::Value, Tensors, Option<&str>)> = vec![
            ("equal", meta.clone(), base.clone(), None),
            (
                "metadata",
                json!({"step": 4, "history": [{"loss": 1.5, "seconds": 2.0}]}),
                base.clone(),
                Some("field step: 3 vs 4"),
            ),
            (
                "an element past the first block",
                meta.clone(),
                vec![base[0].clone(), t("big", vec![50_000], big_changed.clone()), base[2].clone()],
                Some("tensor big: element 40000 differs (40000 vs -1)"),
            ),
            (
                "a tensor of the first only",
                meta.clone(),
                vec![base[0].clone(), base[1].clone()],
                Some("tensor c only in the first state"),
            ),
            (
                "a tensor of the second only, before the others",
                meta.clone(),
                vec![t("0", vec![1], vec![0.0]), base[0].clone(), base[1].clone(), base[2].clone()],
                Some("tensor 0 only in the second state"),
            ),
            (
                "bytes before a shape",
                meta.clone(),
                vec![t("a", vec![2], vec![1.0, 2.5]), base[1].clone(), t("c", vec![1, 2], vec![5.0, 6.0])],
                Some("tensor a: element 1 differs (2 vs 2.5)"),
            ),
            (
                "a shape before bytes",
                meta.clone(),
                vec![t("a", vec![1, 2], vec![1.0, 2.0]), base[1].clone(), t("c", vec![2], vec![5.0, 7.0])],
                Some("tensor a: F32 [2] vs F32 [1, 2]"),
            ),
            (
                "bytes after a tensor of the second only",
                meta.clone(),
                vec![t("0", vec![1], vec![0.0]), base[0].clone(), base[1].clone(), t("c", vec![2], vec![5.0, 7.0])],
                Some("tensor c: element 1 differs (6 vs 7)"),
            ),
        ];
        let first = dir.path().join("first.gz");
        write_state(&first, &meta, &base).unwrap();
        for (case, other_meta, tensors, expected) in cases {
            let second = dir.path().join(format!("{case}.gz"));
            write_state(&second, &other_meta, &tensors).unwrap();
            let in_memory = first_difference(&read_state(&first).unwrap(), &read_state(&second).unwrap(), &[]);
            assert_eq!(in_memory.as_deref(), expected, "{case}: the in-memory answer");
            assert_eq!(first_difference_in_files(&first, &second, &[]).unwrap(), in_memory, "{case}");
        }

        // Equal so far, then cut short: an error naming the tensor, never "no difference".
        let whole = std::fs::read(&first).unwrap();
        let (cut, mut d) = (dir.path().join("cut.gz"), flate2::read::GzDecoder::new(&whole[..]));
        let mut raw = Vec::new();
        d.read_to_end(&mut raw).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&raw[..raw.len() - 4]).unwrap();
        std::fs::write(&cut, gz.finish().unwrap()).unwrap();
        let err = first_difference_in_files(&first, &cut, &[]).unwrap_err().to_string();
        assert!(err.contains("cut.gz") && err.contains("tensor c is cut short"), "{err}");

        // Tensors out of name order (no state orchestrate wrote): compared in
        // memory when small, refused when large, never read whole then.
        let unordered = |path: &Path, elements: usize| {
            let meta = json!({"step": 3, "history": [{"loss": 1.5, "seconds": 2.0}]}).to_string();
            let n = elements * 4;
            let header = serde_json::json!({
                "__metadata__": {META_KEY: meta},
                "z": {"dtype": "F32", "shape": [elements], "data_offsets": [0, n]},
                "a": {"dtype": "F32", "shape": [1], "data_offsets": [n, n + 4]},
            })
            .to_string();
            let mut gz =
                flate2::write::GzEncoder::new(std::fs::File::create(path).unwrap(), flate2::Compression::fast());
            gz.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
            gz.write_all(header.as_bytes()).unwrap();
            // A large one's tensors are never read: its header alone is written.
            if n < (1 << 20) {
                gz.write_all(&vec![0u8; n + 4]).unwrap();
            }
            gz.finish().unwrap();
        };
        let small = dir.path().join("small-unordered.gz");
        unordered(&small, 2);
        assert_eq!(first_difference_in_files(&small, &small, &[]).unwrap(), None);
        let large = dir.path().join("large-unordered.gz");
        unordered(&large, (MAX_COMPARED_IN_MEMORY / 4) as usize);
        let err = first_difference_in_files(&large, &small, &[]).unwrap_err().to_string();
        assert!(err.contains("large-unordered.gz") && err.contains("not in name order"), "{err}");
    }

    /// What `write_state` wrote before it streamed: `safetensors::serialize`
    /// of the whole state in memory, then gzip level 1 in one write.
    fn written_whole(meta: &Value, tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
        let bytes: Vec<Vec<u8>> =
            tensors.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .zip(&bytes)
            .map(|((n, shape, _), b)| {
                (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b).unwrap())
            })
            .collect();
        let mut metadata = HashMap::new();
        metadata.insert(META_KEY.to_string(), meta.to_string());
        let serialized = safetensors::tensor::serialize(views, Some(metadata)).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(1));
        gz.write_all(&serialized).unwrap();
        gz.finish().unwrap()
    }

    /// (Issue #36.) The streamed state is the same file, byte for byte, as
    /// the one written whole (so states written before still read, and a
    /// state written again is the same object); it reads back the same; a
    /// state cut short or with bytes after its last tensor is refused.
    #[test]
    fn a_streamed_state_is_the_file_the_whole_state_gave_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let meta = json!({"step": 3, "kind": "grpo", "lineage": "x"});
        // Names out of order, shapes of several ranks, a tensor larger than a write block.
        let big: Vec<f32> = (0..70_000).map(|i| (i as f32).sin()).collect();
        let tensors = vec![
            ("model/z.weight".to_string(), vec![2, 3], vec![1.0f32, -2.0, 3.5, 0.0, -0.0, f32::MIN_POSITIVE]),
            ("adam_m/a".to_string(), vec![70_000], big),
            ("model/b".to_string(), vec![1], vec![7.25]),
        ];
        let path = dir.path().join("state");
        write_state(&path, &meta, &tensors).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), written_whole(&meta, &tensors), "byte for byte");
        let read = read_state(&path).unwrap();
        assert_eq!(read.meta, meta);
        for (name, shape, values) in &tensors {
            let t = &read.tensors[name];
            assert_eq!(&t.shape, shape);
            let back: Vec<f32> =
                t.bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            assert_eq!(
                back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                values.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
        // Read tensor by tensor: the heads in file order before any tensor;
        // a taker that leaves part of its tensor unread is an error naming it.
        let reader = StateReader::open(&path).unwrap();
        assert_eq!(reader.meta(), &meta);
        let names: Vec<&str> = reader.heads().iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["adam_m/a", "model/b", "model/z.weight"]);
        assert_eq!(reader.heads()[0].bytes, 280_000);
        let e = reader.read_tensors(|_, bytes| bytes.read_exact(&mut [0u8; 8])).unwrap_err();
        assert!(e.to_string().contains("tensor adam_m/a: 8 of its 280000 bytes were read"), "{e}");
        // A tensor that writes other than its size fails the write and leaves nothing.
        let shapes = vec![("w".to_string(), vec![4])];
        let other = dir.path().join("other");
        let e = write_state_streamed(&other, &meta, &shapes, |_, out| write_f32_le(&[1.0, 2.0], out)).unwrap_err();
        assert!(e.to_string().contains("8 bytes written for a size of 16"), "{e}");
        assert!(!other.exists() && !other.with_extension("partial").exists());
        // Damaged files: the gzip of the state cut short, and with a byte more.
        let whole = {
            let mut d = flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap());
            let mut v = Vec::new();
            d.read_to_end(&mut v).unwrap();
            v
        };
        let gz = |bytes: &[u8]| {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(1));
            e.write_all(bytes).unwrap();
            e.finish().unwrap()
        };
        let damaged = dir.path().join("damaged");
        std::fs::write(&damaged, gz(&whole[..whole.len() - 3])).unwrap();
        assert!(read_state(&damaged).unwrap_err().to_string().contains("cut short"));
        std::fs::write(&damaged, gz(&[whole.as_slice(), b"x"].concat())).unwrap();
        assert!(read_state(&damaged).unwrap_err().to_string().contains("after the last tensor"));
        std::fs::write(&damaged, gz(&u64::MAX.to_le_bytes())).unwrap();
        assert!(read_state(&damaged).unwrap_err().to_string().contains("over the"));
    }
}
