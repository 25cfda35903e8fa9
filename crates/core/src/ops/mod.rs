//! The op registry. An op is the code behind a node: it declares its name and
//! version (both in the node key), its params type (in the spec's JSON Schema),
//! the files it depends on, the outputs it writes, and whether its results depend
//! on the numerical environment. The scheduler knows ops only through [`AnyOp`],
//! the object-safe face of every typed [`Op`].

pub mod analysis;
pub mod artifacts;
mod dataset;
pub mod eval;
pub mod gate;
pub mod import;
mod model;
pub mod process;
mod programs;
pub mod results;
mod shell;
mod train;
pub mod worker;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

pub use dataset::{DatasetParams, StockArithmeticDataset};
pub use model::{ModelImport, ModelInit, ModelInitParams, TokenizerBuild, TokenizerParams};
pub use programs::Scripts;
pub use shell::{ShellOp, ShellParams};
pub use train::{
    CheckResume, FaultFamily, FaultSpec, GradientComparison, GrpoParams, GuardProtocol, GuardSwitch, LossStats, Mode,
    NearZero, ReplayFault, ReplayParams, ReplayReport, ReplayRewards, SftBranch, SftParams, TrainGrpo, TrainSft,
    Undefined,
};

use crate::data::Split;

/// What an artifact derives from, for data isolation: a split's pages (what a
/// model may see) or its labels (problems, targets). Taints flow downstream:
/// an output derives from everything its node read unless the op says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum Taint {
    Pages(Split),
    Labels(Split),
}

impl std::fmt::Display for Taint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Taint::Pages(s) => write!(f, "{} pages", s.as_str()),
            Taint::Labels(s) => write!(f, "{} labels", s.as_str()),
        }
    }
}

/// What a node does with data, which decides what it may read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// No restriction (taints still flow through it).
    #[default]
    Any,
    /// Updates parameters: may not read test pages or test labels.
    Training,
    /// Generates from prompts: may not read any labels.
    Inference,
    /// Scores outputs against labels: may read anything.
    Scoring,
}

impl Role {
    /// Why this role may not read an artifact with this taint, if it may not.
    pub fn forbids(self, taint: Taint) -> Option<&'static str> {
        match (self, taint) {
            (Role::Training, Taint::Labels(Split::Test) | Taint::Pages(Split::Test)) => {
                Some("a training node may not read test data")
            }
            (Role::Inference, Taint::Labels(_)) => Some("an inference node may not read labels"),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Any => "any",
            Role::Training => "training",
            Role::Inference => "inference",
            Role::Scoring => "scoring",
        }
    }
}

pub use crate::store::OutputKind;

/// A file of the user's that a node reads as data ([`Op::data_sources`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataSource {
    /// Relative to the spec's folder, normalized.
    pub path: String,
    /// The pages and labels it holds.
    pub taints: Vec<Taint>,
    /// How the node reads it, for errors: `imports as its test split`.
    pub how: String,
}

/// An output an op promises to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputDecl {
    pub name: String,
    pub kind: OutputKind,
    /// For outputs that live in the user's tree (like DVC `outs`): the path,
    /// relative to the spec's folder. Others exist only in the object store.
    pub workspace_path: Option<String>,
    /// What this output derives from; `None`: everything the node read.
    pub taint: Option<std::collections::BTreeSet<Taint>>,
    /// With a declared `taint`: it derives from everything the node read
    /// too (an imported file another node wrote keeps what that file derives
    /// from), not only from what is declared.
    pub inherits: bool,
}

impl OutputDecl {
    /// A store-only file output whose taint is inherited from the node's inputs.
    pub fn file(name: impl Into<String>) -> Self {
        OutputDecl { name: name.into(), kind: OutputKind::File, workspace_path: None, taint: None, inherits: false }
    }
}

/// An input an op reads.
/// What a node's command runs and names, read from the command itself (a
/// `shell` node's `cmd`: [`programs`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandReads {
    /// The programs it runs (relative to the spec's folder): keyed as file deps where they are
    /// files no dep covers, an edge where another node writes one, and
    /// passed over where there is none (a module installed elsewhere).
    pub programs: Vec<String>,
    /// Its Python programs, whose imports of the spec's folder are programs
    /// too ([`crate::reward::python::Imports`], found once per compile).
    pub python: Vec<crate::reward::python::PythonRun>,
    /// Every path of the spec's folder it names (a word, an option's value,
    /// a redirection's file), seen from the folder it runs in: an edge where
    /// another node writes one, and what isolation reads as data the command
    /// may read whether or not a dep declares it.
    pub named: Vec<String>,
    /// The shell scripts it runs (`bash tools/train.sh`, `./run.sh` with a
    /// shell's `#!` line) or sources (`. env.sh`), and the folder each runs
    /// in: the programs their commands run are the node's too ([`Scripts`]).
    pub scripts: Vec<ShellScript>,
}

/// A shell script a command runs, relative to the spec's folder, and the
/// folder (relative to the spec's) its commands run in: the command's, not
/// the script's (`bash tools/train.sh` runs `python3 train.py` of the spec's folder).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShellScript {
    pub file: String,
    pub folder: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputDecl {
    pub name: &'static str,
    pub required: bool,
    pub description: &'static str,
}

impl InputDecl {
    pub fn required(name: &'static str, description: &'static str) -> Self {
        InputDecl { name, required: true, description }
    }
    pub fn optional(name: &'static str, description: &'static str) -> Self {
        InputDecl { name, required: false, description }
    }
}

/// A resolved input as an op sees it: a read-only path and its content hash.
#[derive(Debug, Clone)]
pub struct InputArtifact {
    pub path: PathBuf,
    pub hash: String,
}

/// Everything an op may touch while running one node.
pub struct RunContext<'a> {
    pub node_id: &'a str,
    /// The spec's folder: relative paths in params are relative to it.
    pub spec_dir: &'a Path,
    pub inputs: &'a BTreeMap<String, Vec<InputArtifact>>,
    /// A fresh, empty folder; store-only outputs are written here under their names.
    pub staging: &'a Path,
    /// Where the op writes its log (stdout/stderr of commands, progress).
    pub log_path: &'a Path,
    /// Set when the run is cancelled; long ops poll it.
    pub cancel: &'a AtomicBool,
    /// The workspace root (for registries such as rollout claims).
    pub workspace: &'a Path,
    /// This node's key.
    pub key: &'a crate::store::Key,
    /// The record its key was computed from: the file deps' blake3 that
    /// [`RunContext::read_keyed_file`] checks an op's own read against.
    pub record: &'a crate::record::HashInputs,
    /// The values of its params-file keys that its key was computed with
    /// (file → dotted key → value), for `${param:KEY}` in a command.
    pub params_values: &'a BTreeMap<String, BTreeMap<String, Value>>,
    /// The libtorch CPU threads its key was computed with (numerical nodes).
    pub threads: Option<usize>,
    /// What the op's process cost, set by an op that measured it (the
    /// worker's ops); the executor keeps it in the node's record.
    pub costs: &'a std::sync::OnceLock<crate::costs::NodeCosts>,
    /// Where a training op leaves its run's headline figures (set once).
    pub summary: &'a std::sync::OnceLock<crate::train::metrics::TrainingSummary>,
    /// What the node declares it writes.
    pub outputs: &'a [OutputDecl],
}

impl RunContext<'_> {
    /// The path a store-only output must be written to.
    pub fn output_path(&self, name: &str) -> PathBuf {
        self.staging.join(name)
    }

    /// Reads a file dep (`rel`, relative to the spec's folder, at `path`) that
    /// the op reads itself, up to `max` bytes, and checks that its bytes are
    /// those this node's key was computed with: a file edited after the key
    /// and before this read would otherwise give a result stored under a key
    /// that names other bytes. A dep another node writes is checked against
    /// that node's output.
    pub fn read_keyed_file(&self, rel: &str, path: &Path, max: u64) -> Result<Vec<u8>, OpError> {
        let keyed = self.keyed_hash(rel)?;
        let bytes = crate::fsread::read_bounded_file(path, max)
            .map_err(|e| OpError::Failed(format!("reading '{rel}': {e}")))?;
        same_as_keyed(rel, keyed, blake3::hash(&bytes))?;
        Ok(bytes)
    }

    /// After an op has read a file dep (`rel`) through `file` (parsed it as
    /// a stream, say), checks that the file it read holds the bytes this
    /// node's key was computed with, as [`RunContext::read_keyed_file`]
    /// does: the open file is hashed from its start again. A file edited
    /// before it was opened, or while it was read, is an error.
    pub fn check_keyed_open_file(&self, rel: &str, mut file: &std::fs::File) -> Result<(), OpError> {
        use std::io::Seek;
        let keyed = self.keyed_hash(rel)?;
        let io = |e: std::io::Error| OpError::Failed(format!("reading '{rel}' again to check it: {e}"));
        file.rewind().map_err(io)?;
        let mut hasher = blake3::Hasher::new();
        std::io::copy(&mut file, &mut hasher).map_err(io)?;
        same_as_keyed(rel, keyed, hasher.finalize())
    }

    /// The hash this node's key holds for file dep `rel`.
    fn keyed_hash(&self, rel: &str) -> Result<&str, OpError> {
        self.record
            .file_dep_hash(rel)
            .ok_or_else(|| OpError::Failed(format!("'{rel}' is not among the files this node's key was computed with")))
    }

    /// Writes a store-only output whole. A link planted at its name in
    /// staging is an error naming the output, never written through.
    pub fn write_output(&self, name: &str, bytes: impl AsRef<[u8]>) -> Result<(), OpError> {
        crate::store::fsx::write_file(&self.output_path(name), bytes)
            .map_err(|e| OpError::io(format!("writing {name}"), e))
    }

    /// The node's log, opened to append (what an op records beside a
    /// command's output: the files a Hub op fetched).
    pub fn open_log(&self) -> Result<std::fs::File, OpError> {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path)
            .map_err(|e| OpError::io(format!("opening {}", self.log_path.display()), e))
    }

    /// The path of the (first) artifact of an input.
    pub fn input_path(&self, name: &str) -> Result<&Path, OpError> {
        self.inputs
            .get(name)
            .and_then(|v| v.first())
            .map(|a| a.path.as_path())
            .ok_or_else(|| OpError::Failed(format!("input '{name}' is missing")))
    }
}

/// Reads a JSON-lines artifact, naming the line of the first bad one.
pub fn read_jsonl<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, OpError> {
    let text = std::fs::read_to_string(path).map_err(|e| OpError::io(format!("reading {}", path.display()), e))?;
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| OpError::Failed(format!("{} line {}: {e}", path.display(), i + 1)))
        })
        .collect()
}

pub use crate::record::FILE_DEP_PREFIX;

/// The error for a file dep whose bytes, as an op read them, are not those
/// its node's key was computed with.
fn same_as_keyed(rel: &str, keyed: &str, now: blake3::Hash) -> Result<(), OpError> {
    let now = now.to_hex();
    if now.as_str() == keyed {
        return Ok(());
    }
    Err(OpError::Failed(format!(
        "'{rel}' changed while the run was under way: this node's key holds it as {}, it now reads as {}; run again",
        &keyed[..keyed.len().min(12)],
        &now.as_str()[..12]
    )))
}

pub use crate::canonical::required;

/// A params problem at a path inside the node's `params`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ParamError {
    pub path: Vec<String>,
    pub message: String,
    pub unknown_key: bool,
}

/// An op's failure while running.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("{0}")]
    Failed(String),
    #[error("cancelled")]
    Cancelled,
    /// A worker's op failed and said why ([`worker::WorkerResult`]).
    #[error("{} failed ({}) with {status}: {}", crate::runtime::WORKER, failure.kind, failure.message)]
    Worker { status: String, failure: worker::WorkerFailure },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl From<crate::canonical::ArtifactError> for OpError {
    fn from(e: crate::canonical::ArtifactError) -> Self {
        match e {
            crate::canonical::ArtifactError::Io { path, source } => {
                OpError::Io { context: format!("reading {path}"), source }
            }
            crate::canonical::ArtifactError::Invalid(message) => OpError::Failed(message),
        }
    }
}

impl OpError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        OpError::Io { context: context.into(), source }
    }
}

/// The code behind a node, with its typed params. The params are parsed once,
/// when the DAG compiles; the parsed value is what every method sees, what the
/// node key hashes (encoded back, every default filled in), and what the
/// worker receives. The scheduler holds ops as [`AnyOp`].
pub trait Op: Send + Sync + 'static {
    /// The params as the op reads them. Its JSON Schema goes into the spec schema.
    type Params: DeserializeOwned + Serialize + JsonSchema + Send + Sync + 'static;
    fn name(&self) -> &'static str;
    /// Bump when the op's results change for the same inputs: it is in every key.
    fn version(&self) -> u32;
    /// One line for `orchestrate ops`.
    fn summary(&self) -> &'static str;
    /// Checks beyond what the params type says (errors name a path inside params).
    fn check(&self, _params: &Self::Params) -> Result<(), ParamError> {
        Ok(())
    }
    /// The inputs this op reads, or `None` if it takes any (like `shell`).
    /// Declared inputs are checked when a spec compiles.
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<InputDecl>> {
        None
    }
    /// Inputs implied by the params (a gate file's evidence): (input name,
    /// `NODE:OUTPUT`). Read when the spec compiles; an error is a spec error.
    fn implied_inputs(&self, _params: &Self::Params, _spec_dir: &Path) -> Result<Vec<(String, String)>, ParamError> {
        Ok(Vec::new())
    }
    /// The outputs this node will write.
    fn outputs(&self, params: &Self::Params) -> Vec<OutputDecl>;
    /// Files (relative to the spec's folder) whose content the result depends on.
    /// A file that another node writes becomes an edge to that node.
    fn file_deps(&self, _params: &Self::Params, _spec_dir: &Path) -> Vec<String> {
        Vec::new()
    }
    /// What its command runs and names, read from the command itself
    /// ([`CommandReads`]).
    fn command_reads(&self, _params: &Self::Params, _spec_dir: &Path) -> CommandReads {
        CommandReads::default()
    }
    /// Params files (relative to the spec's folder) and the dotted keys of
    /// each that the result depends on: only those keys' values are in the key.
    fn params_files(&self, _params: &Self::Params) -> Vec<(String, Vec<String>)> {
        Vec::new()
    }
    /// Files of the user's (relative to the spec's folder) this node reads
    /// as a split's data, with what each holds and how to say so: any other
    /// node that reads one reads those pages and labels.
    fn data_sources(&self, _params: &Self::Params) -> Vec<DataSource> {
        Vec::new()
    }
    /// Interpreters the node runs programs with (`python3` of a reward
    /// program): each one's `--version` is in the key.
    fn interpreters(&self, _params: &Self::Params) -> Vec<String> {
        Vec::new()
    }
    /// Whether the key includes the device kind and libtorch version.
    fn numerical(&self) -> bool {
        false
    }
    /// What the node does with data; decides which artifacts it may read.
    fn role(&self, _params: &Self::Params) -> Role {
        Role::Any
    }
    /// An output printed at the end of `orchestrate run` (a results table).
    fn printed_output(&self) -> Option<&'static str> {
        None
    }
    /// What to do instead, said when a file dep of this op is a symbolic
    /// link, which no dep may be (`model.import`: a Hugging Face cache
    /// snapshot is links; `model.hub` reads it).
    fn linked_dep_help(&self) -> Option<&'static str> {
        None
    }
    fn run(&self, params: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError>;
}

/// A node's params, parsed once by its op: the typed value, and its encoding
/// with every default filled in (what the key hashes and the worker receives).
#[derive(Clone)]
pub struct Params {
    resolved: Value,
    typed: Arc<dyn std::any::Any + Send + Sync>,
}

impl Params {
    /// The resolved encoding.
    pub fn value(&self) -> &Value {
        &self.resolved
    }

    /// The typed value, if these are params of type `P` (a reader outside the
    /// op, such as the pack, asking for one op's params).
    pub fn as_typed<P: 'static>(&self) -> Option<&P> {
        self.typed.downcast_ref()
    }

    /// The typed value; only the op that parsed them asks, through [`AnyOp`].
    fn typed<P: 'static>(&self) -> &P {
        self.as_typed().expect("a node's params are handed only to the op that parsed them")
    }
}

impl std::fmt::Debug for Params {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.resolved.fmt(f)
    }
}

/// The object-safe face of every [`Op`] (implemented for all of them), which
/// the registry and the DAG hold.
pub trait AnyOp: Send + Sync {
    fn name(&self) -> &'static str;
    fn version(&self) -> u32;
    fn summary(&self) -> &'static str;
    /// The JSON Schema of the params, added to the spec schema.
    fn params_schema(&self, generator: &mut SchemaGenerator) -> Schema;
    /// Parses the params as written (errors name the path of the first
    /// problem), runs the op's checks, and resolves them: writing a default
    /// out changes nothing, and changing a default in code changes every key
    /// that relied on it.
    fn parse(&self, params: &Value) -> Result<Params, ParamError>;
    fn inputs(&self, params: &Params) -> Option<Vec<InputDecl>>;
    fn implied_inputs(&self, params: &Params, spec_dir: &Path) -> Result<Vec<(String, String)>, ParamError>;
    fn outputs(&self, params: &Params) -> Vec<OutputDecl>;
    fn file_deps(&self, params: &Params, spec_dir: &Path) -> Vec<String>;
    fn command_reads(&self, params: &Params, spec_dir: &Path) -> CommandReads;
    fn params_files(&self, params: &Params) -> Vec<(String, Vec<String>)>;
    fn data_sources(&self, params: &Params) -> Vec<DataSource>;
    fn interpreters(&self, params: &Params) -> Vec<String>;
    fn numerical(&self) -> bool;
    fn role(&self, params: &Params) -> Role;
    fn printed_output(&self) -> Option<&'static str>;
    fn linked_dep_help(&self) -> Option<&'static str>;
    fn run(&self, params: &Params, ctx: &RunContext<'_>) -> Result<(), OpError>;
}

impl<T: Op> AnyOp for T {
    fn name(&self) -> &'static str {
        Op::name(self)
    }
    fn version(&self) -> u32 {
        Op::version(self)
    }
    fn summary(&self) -> &'static str {
        Op::summary(self)
    }
    fn params_schema(&self, generator: &mut SchemaGenerator) -> Schema {
        schema_of::<T::Params>(generator)
    }
    fn parse(&self, params: &Value) -> Result<Params, ParamError> {
        let typed: T::Params = parse_params(params)?;
        self.check(&typed)?;
        let resolved = serde_json::to_value(&typed).map_err(|e| ParamError {
            path: Vec::new(),
            message: format!("the params could not be encoded: {e}"),
            unknown_key: false,
        })?;
        Ok(Params { resolved, typed: Arc::new(typed) })
    }
    fn inputs(&self, params: &Params) -> Option<Vec<InputDecl>> {
        Op::inputs(self, params.typed())
    }
    fn implied_inputs(&self, params: &Params, spec_dir: &Path) -> Result<Vec<(String, String)>, ParamError> {
        Op::implied_inputs(self, params.typed(), spec_dir)
    }
    fn outputs(&self, params: &Params) -> Vec<OutputDecl> {
        Op::outputs(self, params.typed())
    }
    fn file_deps(&self, params: &Params, spec_dir: &Path) -> Vec<String> {
        Op::file_deps(self, params.typed(), spec_dir)
    }
    fn command_reads(&self, params: &Params, spec_dir: &Path) -> CommandReads {
        Op::command_reads(self, params.typed(), spec_dir)
    }
    fn params_files(&self, params: &Params) -> Vec<(String, Vec<String>)> {
        Op::params_files(self, params.typed())
    }
    fn data_sources(&self, params: &Params) -> Vec<DataSource> {
        Op::data_sources(self, params.typed())
    }
    fn interpreters(&self, params: &Params) -> Vec<String> {
        Op::interpreters(self, params.typed())
    }
    fn numerical(&self) -> bool {
        Op::numerical(self)
    }
    fn role(&self, params: &Params) -> Role {
        Op::role(self, params.typed())
    }
    fn printed_output(&self) -> Option<&'static str> {
        Op::printed_output(self)
    }
    fn linked_dep_help(&self) -> Option<&'static str> {
        Op::linked_dep_help(self)
    }
    fn run(&self, params: &Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        Op::run(self, params.typed(), ctx)
    }
}

/// Checks a `prompt_template` param (it must place the statement).
pub(crate) fn check_prompt_template(t: &Option<String>) -> Result<(), ParamError> {
    match t {
        Some(t) => crate::model::chat::check_prompt_template(t).map_err(|message| ParamError {
            path: vec!["prompt_template".into()],
            message: message.to_string(),
            unknown_key: false,
        }),
        None => Ok(()),
    }
}

/// Where a numerical param must lie, checked at `validate` (exit 2) so that a
/// negative learning rate or a NaN never reaches the trainer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Range {
    /// (0, ∞): learning rates, norms, tolerances.
    Positive,
    /// [0, ∞): weight decay, the KL coefficient.
    NonNegative,
    /// [0, 1]: ratios.
    Unit,
    /// (0, 1): a clip ε, so that 0 < 1 − ε < 1 + ε.
    OpenUnit,
    /// A count of at least 1.
    AtLeastOne,
}

impl Range {
    fn holds(self, v: f64) -> bool {
        v.is_finite()
            && match self {
                Range::Positive => v > 0.0,
                Range::NonNegative => v >= 0.0,
                Range::Unit => (0.0..=1.0).contains(&v),
                Range::OpenUnit => v > 0.0 && v < 1.0,
                Range::AtLeastOne => v >= 1.0,
            }
    }

    fn expected(self) -> &'static str {
        match self {
            Range::Positive => "a finite number greater than 0",
            Range::NonNegative => "a finite number at least 0",
            Range::Unit => "a number in [0, 1]",
            Range::OpenUnit => "a number in (0, 1)",
            Range::AtLeastOne => "at least 1",
        }
    }
}

/// Checks each `(field, value, range)`; the first out of range is the error.
pub(crate) fn check_ranges(fields: &[(&str, f64, Range)]) -> Result<(), ParamError> {
    match fields.iter().find(|(_, v, r)| !r.holds(*v)) {
        Some((field, v, r)) => Err(ParamError {
            path: vec![field.to_string()],
            message: format!("{v}: expected {}", r.expected()),
            unknown_key: false,
        }),
        None => Ok(()),
    }
}

/// Reads params into an op's typed params, with the path of the first problem.
pub fn parse_params<P: DeserializeOwned>(params: &Value) -> Result<P, ParamError> {
    crate::canonical::from_value(params).map_err(|e| {
        let mut path: Vec<String> = e
            .path()
            .iter()
            .filter_map(|seg| match seg {
                serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
                serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                _ => None,
            })
            .collect();
        let inner = e.inner().to_string();
        let unknown_key = inner.starts_with("unknown field `");
        let message = if let Some(rest) = inner.strip_prefix("unknown field `") {
            let name = rest.split('`').next().unwrap_or_default().to_string();
            let expected: Vec<&str> = rest.split('`').skip(2).step_by(2).collect();
            if path.last() != Some(&name) {
                path.push(name.clone());
            }
            format!(
                "unknown param '{name}'{}; expected one of: {}",
                crate::suggest::did_you_mean(&name, expected.iter().copied()),
                expected.join(", ")
            )
        } else if let Some(rest) = inner.strip_prefix("missing field `") {
            format!("missing required param '{}'", rest.split('`').next().unwrap_or_default())
        } else {
            inner
        };
        ParamError { path, message, unknown_key }
    })
}

/// The schema of a params type, registered in the generator's definitions.
pub fn schema_of<P: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<P>()
}

/// The ops a spec may name.
#[derive(Clone)]
pub struct Registry {
    ops: BTreeMap<&'static str, Arc<dyn AnyOp>>,
}

impl Registry {
    /// Every op built into this binary.
    pub fn builtin() -> Self {
        let mut r = Registry { ops: BTreeMap::new() };
        r.register(Arc::new(ShellOp));
        r.register(Arc::new(StockArithmeticDataset));
        r.register(Arc::new(import::DatasetImport));
        r.register(Arc::new(import::DatasetHub));
        r.register(Arc::new(TokenizerBuild));
        r.register(Arc::new(ModelInit));
        r.register(Arc::new(ModelImport));
        r.register(Arc::new(model::ModelHub));
        r.register(Arc::new(TrainSft));
        r.register(Arc::new(TrainGrpo));
        r.register(Arc::new(CheckResume));
        r.register(Arc::new(train::Replay));
        r.register(Arc::new(eval::EvalGenerate));
        r.register(Arc::new(eval::EvalScore));
        r.register(Arc::new(results::ResultsTable));
        r.register(Arc::new(analysis::ConstantGroups));
        r.register(Arc::new(analysis::Arms));
        r.register(Arc::new(gate::GateOp));
        r
    }

    pub fn register(&mut self, op: Arc<dyn AnyOp>) {
        self.ops.insert(op.name(), op);
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn AnyOp>> {
        self.ops.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.ops.keys().copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn AnyOp>> {
        self.ops.values()
    }
}
