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

/// Writes a state atomically: f32 tensors (name → shape, values) plus JSON.
pub fn write_state(path: &Path, meta: &Value, tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Result<(), StateError> {
    let io = |context: String| move |source| StateError::Io { context, source };
    let data: Vec<(String, safetensors::tensor::TensorView<'_>)> = Vec::new();
    let bytes: Vec<Vec<u8>> =
        tensors.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let mut views = data;
    for ((name, shape, _), b) in tensors.iter().zip(&bytes) {
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b)
            .map_err(|e| StateError::Invalid { path: path.display().to_string(), message: e.to_string() })?;
        views.push((name.clone(), view));
    }
    let mut metadata = HashMap::new();
    metadata.insert(META_KEY.to_string(), meta.to_string());
    let serialized = safetensors::tensor::serialize(views, Some(metadata))
        .map_err(|e| StateError::Invalid { path: path.display().to_string(), message: e.to_string() })?;
    let tmp = path.with_extension("partial");
    {
        let file = std::fs::File::create(&tmp).map_err(io(format!("creating {}", tmp.display())))?;
        let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::new(1));
        gz.write_all(&serialized).map_err(io(format!("writing {}", tmp.display())))?;
        let file = gz.finish().map_err(io(format!("writing {}", tmp.display())))?;
        file.sync_all().map_err(io(format!("syncing {}", tmp.display())))?;
    }
    std::fs::rename(&tmp, path).map_err(io(format!("publishing {}", path.display())))
}

/// Reads a state file written by [`write_state`].
pub fn read_state(path: &Path) -> Result<StateFile, StateError> {
    let invalid = |message: String| StateError::Invalid { path: path.display().to_string(), message };
    let file = std::fs::File::open(path)
        .map_err(|source| StateError::Io { context: format!("opening {}", path.display()), source })?;
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(file)
        .read_to_end(&mut bytes)
        .map_err(|e| invalid(format!("not a gzip state file: {e}")))?;
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| invalid(e.to_string()))?;
    let meta_text = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get(META_KEY))
        .ok_or_else(|| invalid("no orchestrate state metadata".into()))?
        .clone();
    let meta: Value = serde_json::from_str(&meta_text).map_err(|e| invalid(e.to_string()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| invalid(e.to_string()))?;
    let mut tensors = BTreeMap::new();
    for (name, view) in st.tensors() {
        tensors.insert(
            name,
            RawTensor {
                dtype: format!("{:?}", view.dtype()),
                shape: view.shape().to_vec(),
                bytes: view.data().to_vec(),
            },
        );
    }
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
}
