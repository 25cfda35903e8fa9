//! The command line: clap types and dispatch only. Exit codes: 0 ok, 1 a node,
//! gate or check failed, 2 usage or input error.

/// `println!` that never panics: a closed stdout (`orchestrate run SPEC | head -1`)
/// must not stop or fail anything, so what cannot be written is dropped.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `print!` that never panics (see [`outln`]).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout().lock(), $($arg)*);
    }};
}

mod check;
mod commands;
pub mod events;
mod exit;
mod generate;
mod keys;
mod pack;
mod plan;
mod results;
mod run;
mod shared;
mod tools;
mod transfer;
mod workspace;

pub use generate::GenerateArgs;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// Reproducible, auditable GRPO experiments: YAML specs compiled into a content-hashed DAG.
#[derive(Debug, Parser)]
#[command(name = "orchestrate", version, about, propagate_version = true)]
pub struct Cli {
    /// The workspace folder (object store, cache index, logs).
    #[arg(long, global = true, default_value = ".orchestrate", value_name = "DIR")]
    pub workspace: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

/// Where `push` and `pull` transfer, and how.
#[derive(Debug, Clone, Default, Args)]
pub struct TransferArgs {
    /// The remote (default: ORCHESTRATE_REMOTE, else `remote.url` in WORKSPACE/config.yaml).
    #[arg(long, value_name = "URL")]
    pub remote: Option<String>,
    /// Parallel transfers (default: the config's `remote.jobs`, else 8).
    #[arg(long, short = 'j', value_name = "N", value_parser = at_least_one)]
    pub jobs: Option<usize>,
    /// The summary as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// Signing what is pushed, and what is taken from a remote.
#[derive(Debug, Clone, Default, Args)]
pub struct TrustArgs {
    /// push: sign records with this key (a name in the user's key folder or a
    /// PEM file's path; default: ORCHESTRATE_SIGNING_KEY, else `signing_key`
    /// in WORKSPACE/config.yaml; none: unsigned).
    #[arg(long, value_name = "NAME|PATH", help_heading = "Trust")]
    pub key: Option<String>,
    /// Take records that no trusted key signed even where the workspace
    /// requires a signature; each is reported as unverified.
    #[arg(long, help_heading = "Trust")]
    pub trust_unsigned: bool,
}

/// `--remote [URL]` of `run` and `plan`.
#[derive(Debug, Clone, Default, Args)]
pub struct RemoteArgs {
    /// Consult a shared remote cache on a local miss: `--remote s3://bucket/prefix`
    /// (or `file:///path`), or `--remote` alone for ORCHESTRATE_REMOTE or
    /// `remote.url` in WORKSPACE/config.yaml. Credentials: the AWS variables and files.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "", help_heading = "Remote cache")]
    pub remote: Option<String>,
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// How a spec is read: the profile and overrides.
#[derive(Debug, Clone, Args)]
pub struct SpecArgs {
    /// The experiment spec (YAML).
    pub spec: PathBuf,
    /// A named profile from the spec's `profiles:`.
    #[arg(long, value_name = "P")]
    pub profile: Option<String>,
    /// Override a value: `--set nodes.grpo.params.lr=1e-6` (the value is YAML).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
    #[command(flatten)]
    pub executor: ExecutorArgs,
}

/// `--executor`: the spec's [`ExecutorKind`](orchestrate_core::spec::ExecutorKind) on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExecutorArg {
    /// On this machine, as child processes of `orchestrate run`.
    Local,
    /// As Slurm jobs (`sbatch`), each running `orchestrate exec-node` on the shared workspace.
    Slurm,
}

impl From<ExecutorArg> for orchestrate_core::spec::ExecutorKind {
    fn from(kind: ExecutorArg) -> Self {
        match kind {
            ExecutorArg::Local => orchestrate_core::spec::ExecutorKind::Local,
            ExecutorArg::Slurm => orchestrate_core::spec::ExecutorKind::Slurm,
        }
    }
}

/// Where nodes run; these override the spec's `executor:` and `slurm:` (and
/// every node's `resources:`). GPUs decide the device numerical nodes are keyed
/// on under Slurm, so `plan`, `explain` and `pack freeze` take them too.
#[derive(Debug, Clone, Default, Args)]
pub struct ExecutorArgs {
    /// `local` (this machine) or `slurm` (one sbatch job per node).
    #[arg(long, value_enum, value_name = "KIND", help_heading = "Executor")]
    pub executor: Option<ExecutorArg>,
    /// Slurm partition of every job.
    #[arg(long, value_name = "NAME", help_heading = "Executor")]
    pub partition: Option<String>,
    /// Slurm account of every job.
    #[arg(long, value_name = "NAME", help_heading = "Executor")]
    pub account: Option<String>,
    /// Slurm time limit of every job (`4:00:00`).
    #[arg(long, value_name = "TIME", help_heading = "Executor")]
    pub time: Option<String>,
    /// GPUs per node of every job.
    #[arg(long, value_name = "N", help_heading = "Executor")]
    pub gpus: Option<u32>,
    /// CPUs per task of every job.
    #[arg(long, value_name = "N", help_heading = "Executor")]
    pub cpus: Option<u32>,
    /// Memory of every job (`64G`).
    #[arg(long, value_name = "SIZE", help_heading = "Executor")]
    pub mem: Option<String>,
    /// Resubmit a job that hit its time limit, was preempted or lost its node, up to N times.
    #[arg(long, value_name = "N", help_heading = "Executor")]
    pub retries: Option<u32>,
    /// An extra sbatch option for every job (repeatable): `--sbatch=--qos=high`.
    #[arg(long, value_name = "OPTION", allow_hyphen_values = true, help_heading = "Executor")]
    pub sbatch: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a spec: every node not already cached, in dependency order.
    Run(RunArgs),
    /// Each node: cached, or will run and why.
    Plan(PlanArgs),
    /// Upload cached nodes (records and output objects) to the remote cache:
    /// the spec's, or every cached node with `--all`. Objects go before the
    /// record that names them; what the remote has is skipped (HEAD requests).
    Push(PushArgs),
    /// Download from the remote cache what a run of the spec (or of these
    /// targets) needs and the local cache lacks. Every object is re-hashed
    /// before it is published; a record is kept only once all its objects are.
    Pull(PullArgs),
    /// Make the outs in the tree match the store, as `dvc checkout`: each node
    /// (or these targets and what they need) whose current key is cached has
    /// its missing or changed outs checked out of the store. Nothing runs.
    /// Exit 1 when a node's key is not in the store.
    Checkout(CheckoutArgs),
    /// The hash-input diff of a node between its cached record and now.
    Explain(ExplainArgs),
    /// Print the store path of a cached output (`NODE:OUTPUT`), e.g. `cat $(orchestrate path s.yaml data:summary)`.
    Path(PathArgs),
    /// Check a spec without running it.
    Validate(ValidateArgs),
    /// Print the spec JSON Schema, or write it (with the pages and labels row schemas) into a folder.
    Schema(SchemaArgs),
    /// Recent runs and their nodes.
    Status(StatusArgs),
    /// Search a run's events: the engine's (node started, cached, finished,
    /// failed) and the sealed guard events of its GRPO nodes.
    Events(EventsArgs),
    /// POST every non-ALLOW guard decision of a run to a webhook, as JSON.
    AlertScan(AlertScanArgs),
    /// One self-contained HTML report (inline SVG, no network) of a run or a pack:
    /// the DAG, GRPO and SFT curves, evaluation, costs, gates, fault matrix.
    /// With several runs or packs (or `--group-by`), their GRPO and SFT curves
    /// overlaid, one line per run, a legend naming each.
    Report(ReportArgs),
    /// What changed between runs, specs (their latest run) or pack folders, and
    /// why: the hash-input fields of nodes whose keys differ, the metrics of
    /// matching nodes with the signed change, and gates whose verdict flipped.
    /// The first is the baseline. Exit 0 whatever differs (a comparison is not
    /// a check); 2 if something named cannot be read.
    Compare(CompareArgs),
    /// Export a run's or a pack's curves for other tools.
    #[command(subcommand)]
    Export(ExportCommand),
    /// Run one node submitted by `orchestrate run` with executor slurm, from a
    /// shared workspace: what each Slurm job runs. Exit code 0 if the node ran
    /// or was cached, 1 if it failed, 2 if the ticket or spec cannot be read.
    ExecNode(ExecNodeArgs),
    /// The ops a spec can use.
    Ops,
    /// Check the store: every cached output present with its recorded hash.
    Verify,
    /// Remove what no kept run needs from the store, as `dvc gc`: cache rows,
    /// their records and logs, and the objects no kept row or run names. Kept: every
    /// result of each kept spec's latest `--keep-runs` runs, each of its nodes'
    /// most recent result where the latest run did not finish that node, and
    /// what a `--keep-pack` pack lists. Refused while another process has the
    /// workspace open.
    Gc(GcArgs),
    /// The store's size by spec and node, largest first (`dvc du`-like).
    Du(DuArgs),
    /// Rebuild the index's cache rows from the node records under
    /// .orchestrate/records (after a damaged index was moved aside).
    Reindex,
    /// The numerical environment (libtorch version, device) numerical ops are keyed on.
    Env,
    /// Frozen release packs: freeze, verify.
    #[command(subcommand)]
    Pack(PackCommand),
    /// Verify a pack, then re-evaluate its gates from its own files (no workspace, no libtorch).
    /// Exit code 0 only if the pack is intact and every gate passes.
    Audit(AuditArgs),
    /// The trajectory guard: its reason codes.
    #[command(subcommand)]
    Guard(GuardCommand),
    /// Generate a response from a model folder (runs in the libtorch worker).
    Generate(GenerateArgs),
    /// Score responses by hand and list the registered verifiers.
    #[command(subcommand)]
    Verifier(VerifierCommand),
    /// Signing keys: a key pair in the user's config folder, whose public
    /// line a workspace lists under `trusted_keys` (docs/remote.md).
    #[command(subcommand)]
    Key(KeyCommand),
}

/// The arguments of `orchestrate run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Run only these nodes and what they need (as `dvc repro STAGE` and
    /// Snakemake targets); a matrix node's written id (`grpo`) names every
    /// expansion. None: the whole spec.
    #[arg(value_name = "NODE")]
    pub targets: Vec<String>,
    /// Run at most N nodes at once (with Slurm: jobs queued or running).
    #[arg(long, short = 'j', default_value_t = default_jobs(), value_name = "N", value_parser = at_least_one)]
    pub jobs: usize,
    /// Run this node even if it is cached (repeatable); a matrix node's
    /// written id (`grpo`) names every expansion (`grpo@seed=0`, ...).
    #[arg(long, value_name = "NODE")]
    pub force: Vec<String>,
    /// Print the plan and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// One JSON event per line instead of progress.
    #[arg(long)]
    pub json: bool,
    /// Only failures and the summary.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Upload the nodes this run executed to the remote cache afterwards.
    #[arg(long)]
    pub push: bool,
    /// Drop each training state once every node that reads it has
    /// finished (its node stays cached; a later run that needs the state
    /// runs the node again): what fits `--profile shapes-0.5b` on a 64 GB disk.
    #[arg(long)]
    pub drop_states: bool,
    /// Re-execute the cached NODEs (none: every node) and compare each
    /// output's hash with the cached one, as `nix build --check`; nothing
    /// in the cache changes. Exit 1 if any output differs. With
    /// `--remote`, nodes this workspace lacks are taken from the remote;
    /// with `--push --key K`, what reproduced is counter-signed there.
    #[arg(long, conflicts_with_all = ["dry_run", "force", "drop_states"])]
    pub check: bool,
}

/// The arguments of `orchestrate plan`.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Plan only these nodes and what they need (as `run NODE...`).
    #[arg(value_name = "NODE")]
    pub targets: Vec<String>,
    /// Plan as if these nodes were forced.
    #[arg(long, value_name = "NODE")]
    pub force: Vec<String>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// The arguments of `orchestrate push`.
#[derive(Debug, clap::Args)]
pub struct PushArgs {
    /// The spec whose cached nodes to push.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub spec: Option<PathBuf>,
    /// The spec's profile.
    #[arg(long, value_name = "P")]
    pub profile: Option<String>,
    /// Push every node cached in the workspace.
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub transfer: TransferArgs,
}

/// The arguments of `orchestrate pull`.
#[derive(Debug, clap::Args)]
pub struct PullArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Only these nodes and what they need.
    #[arg(value_name = "NODE")]
    pub targets: Vec<String>,
    #[command(flatten)]
    pub transfer: TransferArgs,
}

/// The arguments of `orchestrate checkout`.
#[derive(Debug, clap::Args)]
pub struct CheckoutArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Only these nodes and what they need.
    #[arg(value_name = "NODE")]
    pub targets: Vec<String>,
    /// Replace outs whose bytes in the tree the store does not hold (edits
    /// by hand, files added to a folder out); without it they are kept and
    /// named, and the exit code is 1, as `dvc checkout` without --force.
    #[arg(long, short = 'f')]
    pub force: bool,
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `orchestrate explain`.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    /// The node id (matrix nodes: `ID@axis=value`).
    pub node: String,
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `orchestrate path`.
#[derive(Debug, clap::Args)]
pub struct PathArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    /// The output, as `NODE:OUTPUT`.
    pub output: String,
}

/// The arguments of `orchestrate validate`.
#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// The arguments of `orchestrate schema`.
#[derive(Debug, clap::Args)]
pub struct SchemaArgs {
    /// Write `experiment.schema.json` into this folder.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// The arguments of `orchestrate status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Show this run's nodes (default: the latest run).
    #[arg(long, value_name = "RUN")]
    pub run: Option<String>,
    /// How many runs to list.
    #[arg(long, default_value_t = 10)]
    pub limit: usize,
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `orchestrate events`.
#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// The run (default: the latest).
    #[arg(long, value_name = "RUN")]
    pub run: Option<String>,
    /// Only this event type (`node_finished`, `decision`, `update_applied`, ...).
    #[arg(long = "type", value_name = "TYPE")]
    pub kind: Option<String>,
    /// Only events carrying this reason code (`T001` or `T001_ARTIFACT_HASH_MISMATCH`).
    #[arg(long, value_name = "CODE")]
    pub code: Option<String>,
    /// Only this node (a matrix node's base id matches every expansion).
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `orchestrate alert-scan`.
#[derive(Debug, clap::Args)]
pub struct AlertScanArgs {
    /// The run (default: the latest).
    #[arg(long, value_name = "RUN")]
    pub run: Option<String>,
    /// Where to POST (an http:// or https:// URL).
    #[arg(long, value_name = "URL", value_parser = events::parse_webhook)]
    pub webhook: String,
    /// Send a Slack-compatible `{"text": ...}` message.
    #[arg(long)]
    pub slack: bool,
    /// Retries per alert after the first attempt (5xx, 429 and transport errors).
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Seconds one alert may take in all, retries included: a server that
    /// never answers is cut then.
    #[arg(long, value_name = "SECS", default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout: u64,
    /// Print the alerts instead of posting them.
    #[arg(long)]
    pub dry_run: bool,
}

/// The arguments of `orchestrate report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Run ids of the workspace, spec files (their latest run) or pack
    /// folders (default: the latest run).
    pub targets: Vec<String>,
    /// Where to write the HTML.
    #[arg(long, value_name = "FILE", default_value = "report.html")]
    pub out: PathBuf,
    /// Draw a matrix node's expansions over this axis (e.g. `seed`) as one
    /// mean line with a band of ± one sample std.
    #[arg(long, value_name = "AXIS")]
    pub group_by: Option<String>,
    /// The profile of SPEC targets.
    #[arg(long, value_name = "P")]
    pub profile: Option<String>,
}

/// The arguments of `orchestrate compare`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Run ids of the workspace, spec files (their latest run) or pack
    /// folders; with `--group-by`, exactly one.
    #[arg(required = true, value_name = "RUN|SPEC|PACK")]
    pub targets: Vec<String>,
    /// The profile of every SPEC argument (its latest run with that profile).
    #[arg(long, value_name = "P")]
    pub profile: Option<String>,
    /// Also show the rows that are the same everywhere.
    #[arg(long)]
    pub all: bool,
    /// Group one run's matrix nodes over this axis (e.g. `seed`): mean ±
    /// std and n at each remaining matrix point, and paired bootstrap
    /// intervals between evaluations of the same problems.
    #[arg(long, value_name = "AXIS")]
    pub group_by: Option<String>,
    /// The comparison as JSON.
    #[arg(long, conflicts_with = "md")]
    pub json: bool,
    /// The comparison as Markdown tables.
    #[arg(long)]
    pub md: bool,
}

/// The arguments of `orchestrate exec-node`.
#[derive(Debug, clap::Args)]
pub struct ExecNodeArgs {
    /// The shared workspace folder.
    pub workspace: PathBuf,
    /// The node's key (its ticket is `WORKSPACE/slurm/tickets/KEY.json`).
    pub key: String,
}

/// The arguments of `orchestrate gc`.
#[derive(Debug, clap::Args)]
pub struct GcArgs {
    /// The specs whose latest runs are kept (files; their `name` is what counts).
    /// Give them, or `--all-specs`.
    #[arg(value_name = "SPEC", required_unless_present = "all_specs")]
    pub specs: Vec<PathBuf>,
    /// Keep the latest runs of every spec the workspace has seen.
    #[arg(long, conflicts_with = "specs")]
    pub all_specs: bool,
    /// How many of each kept spec's latest runs to keep whole.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub keep_runs: u64,
    /// Also drop the training states (`state` outputs) of the kept results,
    /// the largest objects (a model plus AdamW's two moments): their nodes
    /// and everything that read them stay cached; a run that needs a state
    /// again runs its node first. Bit-exact resume makes that state again.
    #[arg(long)]
    pub drop_states: bool,
    /// Also keep every node and output a frozen pack folder lists (repeatable).
    #[arg(long, value_name = "DIR")]
    pub keep_pack: Vec<PathBuf>,
    /// Also empty the workspace's trash: the outs that runs and checkouts
    /// moved aside because they held bytes the store lacked (your files at an
    /// out's path, hand edits). They are yours, not the cache's, so gc keeps
    /// them unless asked.
    #[arg(long)]
    pub empty_trash: bool,
    /// List what would be removed (counts and bytes); remove nothing.
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `orchestrate du`.
#[derive(Debug, clap::Args)]
pub struct DuArgs {
    /// How many nodes to list (the rest are summed).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `orchestrate audit`.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// The pack folder.
    pub dir: PathBuf,
    /// The root digest the pack must have (`sha256:HEX`, as `pack freeze`
    /// printed it and the release note or tag carries it).
    #[arg(long, value_name = "DIGEST", value_parser = orchestrate_core::pack::parse_digest)]
    pub expect: Option<String>,
    /// Also check the pack's signature (model.sig, `pack sign`) by this
    /// public key: a `.pub` PEM file, a key name in the user's key folder,
    /// or a `NAME:BASE64` line. Unsigned, another key's, or any file
    /// changed since signing fails the audit.
    #[arg(long, value_name = "PUB")]
    pub key: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Make a P-256 key pair NAME.pem (mode 0600) and NAME.pub in the user's
    /// key folder and print the line to trust it by; never overwrites a key.
    Generate {
        /// The key's name, as signatures and `trusted_keys` name it (`alice`, `ci-1`).
        name: String,
    },
    /// Print the `NAME:BASE64` line of a key (for `trusted_keys`), or with
    /// `--pem` its public key as PEM (for `model_signing verify key`).
    Show {
        name: String,
        #[arg(long)]
        pem: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum GuardCommand {
    /// The table of reason codes (code, family, decision, meaning) as Markdown.
    Codes,
    /// Spend a nonce in the workspace: prints `won` (exit 0) for the one caller
    /// that spends it, `lost` (exit 1) for everyone else.
    #[command(hide = true)]
    SpendNonce { nonce: String },
}

#[derive(Debug, Subcommand)]
pub enum ExportCommand {
    /// TensorBoard event files: one run folder per training node (`DIR/NODE`),
    /// scalars per GRPO iteration and per SFT update under TRL's names as
    /// TensorBoard shows them (`train/reward`, `train/kl`, ...). Then
    /// `tensorboard --logdir DIR`. Exit 1 if a node's metrics could not be read.
    Tensorboard {
        /// A run id of the workspace, a spec (its latest run) or a pack folder.
        target: String,
        /// The log folder; a run folder that already exists is refused.
        dir: PathBuf,
        /// The profile of a SPEC target.
        #[arg(long, value_name = "P")]
        profile: Option<String>,
    },
}

// Parsed once per process: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum PackCommand {
    /// Freeze a spec's cached results into a new pack folder (never into an existing one).
    Freeze {
        #[command(flatten)]
        spec: SpecArgs,
        /// The pack folder to create, e.g. artifacts/grpo-main-tiny/v0.1.0.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Include model folders (large).
        #[arg(long)]
        with_models: bool,
        /// Include full training states (large).
        #[arg(long)]
        with_states: bool,
        /// List larger outputs by hash without copying them.
        #[arg(long, value_name = "BYTES", default_value_t = 8 << 20)]
        max_output_bytes: u64,
    },
    /// Check every checksum, that no file is missing or extra, the event chain, and the manifest's hashes.
    Verify {
        /// The pack folder.
        dir: PathBuf,
        /// The root digest the pack must have (see `audit --expect`).
        #[arg(long, value_name = "DIGEST", value_parser = orchestrate_core::pack::parse_digest)]
        expect: Option<String>,
        /// Also check its signature by this public key (see `audit --key`).
        #[arg(long, value_name = "PUB")]
        key: Option<String>,
    },
    /// Sign an intact pack in the OpenSSF model-signing format: DIR/model.sig,
    /// a Sigstore bundle over every file's SHA-256 with the pack's provenance,
    /// which `model_signing verify key DIR --signature DIR/model.sig
    /// --public_key KEY.pub` and `audit DIR --key KEY` verify.
    Sign {
        /// The pack folder.
        dir: PathBuf,
        /// The signing key: a name in the user's key folder or a PEM file's path.
        #[arg(long, value_name = "NAME|PATH")]
        key: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum VerifierCommand {
    /// The registered verifiers with their protocol hashes.
    List,
    /// Score the response read from stdin; prints {reward, valid, value, expected, reason}.
    /// Exit code 0 for reward 1, 1 for reward 0.
    Check {
        /// The verifier's name (see `orchestrate verifier list`).
        name: String,
        /// The structured problem as JSON, e.g. '{"initial": 5, "deliveries": [3, 2], "withdrawals": [4, 1]}'.
        #[arg(long, value_name = "JSON")]
        problem: String,
        /// How generation ended.
        #[arg(long, value_enum, default_value_t = Finish::Eos)]
        finish: Finish,
        /// Treat the response as containing an id the tokenizer cannot decode.
        #[arg(long)]
        undecodable: bool,
        /// Keep a trailing newline of stdin as part of the response (by default one is dropped).
        #[arg(long)]
        keep_newline: bool,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Finish {
    Eos,
    Length,
}

fn default_jobs() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// A count of at least 1 (`--jobs`): 0 is refused, not read as 1.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("expected a count of at least 1 (0 would run nothing; there is no 'unlimited')".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("expected a whole number of at least 1 ({e})")),
    }
}

/// Parses arguments and runs the command.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match commands::dispatch(cli) {
        Ok(status) => status.code(),
        Err(e) => {
            let e = exit::CliError::classify(e);
            eprintln!("error: {e}");
            e.code()
        }
    }
}
