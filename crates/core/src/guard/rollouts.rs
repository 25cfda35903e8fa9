//! A GRPO node's `rollouts` output: the token artifacts each iteration
//! generated, the evidence behind its guard log. One file per iteration,
//! `iter-000007.jsonl`, holding one rollout's [`TokenArtifacts`] per line in
//! their canonical bytes, in rollout order; each line's blake3 is the
//! `artifacts_hash` its envelope names and the iteration's `generation` event
//! lists. An auditor holding the node's outputs checks the tokens the
//! optimizer consumed by hashing lines, trusting neither the store nor us.
//!
//! The worker writes and reads these files (the materializer rebuilds a batch
//! from what was written, never from memory); the engine reads them to check a
//! guard log ([`check_generated`]). Both go through this module.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::TokenArtifacts;
use crate::store::fsx;

/// The output's name on a `train.grpo` node.
pub const OUTPUT: &str = "rollouts";

/// The largest iteration file read (a 0.5B run's iteration of 16 prompts × 8
/// rollouts × 512 tokens is about 2 MB).
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// The file holding an iteration's rollouts.
pub fn file_name(iteration: usize) -> String {
    format!("iter-{iteration:06}.jsonl")
}

/// The iteration a file of this output holds, if `name` is one.
pub fn iteration_of(name: &str) -> Option<usize> {
    let digits = name.strip_prefix("iter-")?.strip_suffix(".jsonl")?;
    (digits.len() == 6 && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok())?
}

#[derive(Debug, thiserror::Error)]
pub enum RolloutsError {
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Bounded(#[from] crate::fsread::BoundedFileError),
    #[error("{}: line {line} is not a rollout's token artifacts: {message}", .path.display())]
    Line { path: PathBuf, line: usize, message: String },
    #[error("{}: line {line} is not in canonical form, so its hash is not the rollout's", .path.display())]
    NotCanonical { path: PathBuf, line: usize },
    #[error("{}: a folder of rollouts must be a real folder, not a link", .path.display())]
    NotAFolder { path: PathBuf },
    #[error("iteration {iteration}: {problem}")]
    Generated { iteration: usize, problem: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RolloutsError + '_ {
    move |source| RolloutsError::Io { path: path.to_path_buf(), source }
}

/// Makes `dir` (a real folder; a link there is refused, never followed).
pub fn ensure_dir(dir: &Path) -> Result<(), RolloutsError> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_dir() => Ok(()),
        Ok(_) => Err(RolloutsError::NotAFolder { path: dir.to_path_buf() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir(dir).map_err(io(dir)),
        Err(e) => Err(io(dir)(e)),
    }
}

/// Writes an iteration's rollouts into `dir`, create-new (an iteration is
/// written once; a file or a link already there is an error, never
/// overwritten), synced before it returns. Returns each rollout's hash.
pub fn write_iteration(
    dir: &Path,
    iteration: usize,
    artifacts: &[TokenArtifacts],
) -> Result<Vec<String>, RolloutsError> {
    let path = dir.join(file_name(iteration));
    let (bytes, hashes) = encode(artifacts);
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path).map_err(io(&path))?;
    file.write_all(&bytes).map_err(io(&path))?;
    file.sync_all().map_err(io(&path))?;
    Ok(hashes)
}

/// Writes an iteration's rollouts into `dir` in place of any earlier copy:
/// under a temporary name (a link there is an error, never written through),
/// synced, then renamed over the old one, so a crash leaves one or the other.
pub fn replace_iteration(dir: &Path, iteration: usize, artifacts: &[TokenArtifacts]) -> Result<(), RolloutsError> {
    let name = file_name(iteration);
    let (path, partial) = (dir.join(&name), dir.join(format!("{name}.partial")));
    let (bytes, _) = encode(artifacts);
    let mut file = fsx::open_truncate(&partial).map_err(io(&partial))?;
    file.write_all(&bytes).map_err(io(&partial))?;
    file.sync_all().map_err(io(&partial))?;
    std::fs::rename(&partial, &path).map_err(io(&path))
}

/// An iteration file's bytes (each rollout's canonical bytes and a newline)
/// and each rollout's hash.
fn encode(artifacts: &[TokenArtifacts]) -> (Vec<u8>, Vec<String>) {
    let mut bytes = Vec::new();
    let mut hashes = Vec::with_capacity(artifacts.len());
    for a in artifacts {
        let line = a.canonical_bytes();
        hashes.push(blake3::hash(&line).to_hex().to_string());
        bytes.extend_from_slice(&line);
        bytes.push(b'\n');
    }
    (bytes, hashes)
}

/// Reads an iteration's rollouts back from `dir`: a regular file of bounded
/// size, each line a rollout's token artifacts in canonical form, with its
/// hash (the blake3 of the line as stored).
pub fn read_iteration(dir: &Path, iteration: usize) -> Result<Vec<(String, TokenArtifacts)>, RolloutsError> {
    // The folder too: a link there would have its target's files read as ours.
    if !std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        return Err(RolloutsError::NotAFolder { path: dir.to_path_buf() });
    }
    let path = dir.join(file_name(iteration));
    let bytes = crate::fsread::read_bounded_file(&path, MAX_FILE_BYTES)?;
    let mut out = Vec::new();
    if bytes.is_empty() {
        return Ok(out);
    }
    // Every line ends with a newline: a file cut short is not read as complete.
    let Some(body) = bytes.strip_suffix(b"\n") else {
        let line = bytes.iter().filter(|b| **b == b'\n').count() + 1;
        return Err(RolloutsError::Line { path, line, message: "the file ends inside this line".into() });
    };
    for (i, line) in body.split(|b| *b == b'\n').enumerate() {
        let artifacts: TokenArtifacts = serde_json::from_slice(line).map_err(|e| RolloutsError::Line {
            path: path.clone(),
            line: i + 1,
            message: e.to_string(),
        })?;
        if artifacts.canonical_bytes() != line {
            return Err(RolloutsError::NotCanonical { path: path.clone(), line: i + 1 });
        }
        out.push((blake3::hash(line).to_hex().to_string(), artifacts));
    }
    Ok(out)
}

/// Copies the files of the iterations in `iterations` from `from` into `to`,
/// each read and checked first, then written by `write` ([`write_iteration`]
/// or [`replace_iteration`]): how the update WAL keeps an attempt's rollouts
/// with its checkpoints, and gives them back to the attempt that recovers one.
pub fn copy_iterations<T>(
    from: &Path,
    to: &Path,
    iterations: impl IntoIterator<Item = usize>,
    write: fn(&Path, usize, &[TokenArtifacts]) -> Result<T, RolloutsError>,
) -> Result<(), RolloutsError> {
    for iteration in iterations {
        let read: Vec<TokenArtifacts> = read_iteration(from, iteration)?.into_iter().map(|(_, a)| a).collect();
        write(to, iteration, &read)?;
    }
    Ok(())
}

/// Checks a guard log's generation events against the rollouts that hold
/// them: for each `(iteration, artifact hashes)` the log sealed, `find`
/// gives the folder of the node that generated it (the node of that
/// lineage whose rollouts hold the iteration), whose file for the iteration
/// must hold exactly those rollouts, in that order.
pub fn check_generated(
    generated: &[(usize, Vec<String>)],
    find: impl Fn(usize) -> Option<PathBuf>,
) -> Result<(), RolloutsError> {
    for (iteration, hashes) in generated {
        let problem = |problem: String| RolloutsError::Generated { iteration: *iteration, problem };
        let Some(dir) = find(*iteration) else {
            return Err(problem(format!(
                "the guard log says {} rollouts were generated, but no node's {OUTPUT} output holds {}",
                hashes.len(),
                file_name(*iteration)
            )));
        };
        let held: Vec<String> = read_iteration(&dir, *iteration)
            .map_err(|e| problem(format!("its {OUTPUT}: {e}")))?
            .into_iter()
            .map(|(h, _)| h)
            .collect();
        if &held != hashes {
            let missing = hashes.iter().filter(|h| !held.contains(h)).count();
            return Err(problem(format!(
                "the {OUTPUT} in {} hold {} rollouts, the guard log names {} ({missing} of them not held, or out of order)",
                dir.display(),
                held.len(),
                hashes.len()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifacts(seed: i64) -> TokenArtifacts {
        TokenArtifacts {
            prompt_ids: vec![1, 2, seed],
            response_ids: vec![seed, 7],
            old_logprobs: vec![-0.5, -1.25],
            mask_start: 3,
            mask_len: 2,
        }
    }

    #[test]
    fn an_iteration_reads_back_as_written_with_each_rollouts_own_hash() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_iteration(dir.path(), 3, &[artifacts(4), artifacts(5)]).unwrap();
        assert_eq!(written, vec![artifacts(4).hash(), artifacts(5).hash()]);
        let read = read_iteration(dir.path(), 3).unwrap();
        assert_eq!(read, vec![(artifacts(4).hash(), artifacts(4)), (artifacts(5).hash(), artifacts(5))]);
        assert_eq!(iteration_of(&file_name(3)), Some(3));
        assert_eq!(iteration_of("iter-3.jsonl"), None);
        // Written once: a second write of the iteration is refused and changes nothing.
        assert!(write_iteration(dir.path(), 3, &[artifacts(9)]).is_err());
        assert_eq!(read_iteration(dir.path(), 3).unwrap().len(), 2);
    }

    #[test]
    fn an_edited_or_linked_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        write_iteration(dir.path(), 0, &[artifacts(4)]).unwrap();
        let path = dir.path().join(file_name(0));
        let text = std::fs::read_to_string(&path).unwrap();
        // The same rollout with its keys reordered: another hash than the envelope's.
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        std::fs::write(&path, format!("{}\n", serde_json::to_string_pretty(&v).unwrap().replace('\n', ""))).unwrap();
        let e = read_iteration(dir.path(), 0).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("canonical"), "{e}");
        std::fs::write(&path, "{\"prompt_ids\": \"text\"}\n").unwrap();
        let e = read_iteration(dir.path(), 0).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("token artifacts"), "{e}");
        let elsewhere = dir.path().join("elsewhere.jsonl");
        std::fs::rename(&path, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        assert!(read_iteration(dir.path(), 0).is_err(), "a link was followed");
        assert!(write_iteration(dir.path(), 0, &[artifacts(1)]).is_err(), "written through a link");
        assert!(std::fs::read_to_string(&elsewhere).unwrap().contains("text"));
    }

    #[test]
    fn a_guard_log_naming_rollouts_not_held_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        write_iteration(dir.path(), 0, &[artifacts(4), artifacts(5)]).unwrap();
        let at = |i: usize| (i == 0).then(|| dir.path().to_path_buf());
        let log = vec![(0, vec![artifacts(4).hash(), artifacts(5).hash()])];
        check_generated(&log, at).unwrap();
        let other = vec![(0, vec![artifacts(4).hash(), artifacts(6).hash()])];
        let e = check_generated(&other, at).unwrap_err().to_string();
        assert!(e.contains("iteration 0") && e.contains("1 of them not held"), "{e}");
        let later = vec![(1, vec![artifacts(4).hash()])];
        let e = check_generated(&later, at).unwrap_err().to_string();
        assert!(e.contains("iteration 1") && e.contains(&file_name(1)), "{e}");
    }
}
