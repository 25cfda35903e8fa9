//! Ops whose outputs live only in the store, and the numerical environment part of keys.

use std::collections::BTreeSet;
use std::sync::Arc;

use orchestrate_core::dag::key::EnvPart;
use orchestrate_core::exec::plan::{plan, PlanState};
use orchestrate_core::exec::report::Reporter;
use orchestrate_core::exec::{self, EnvProvider, Event, Outcome, RunOptions};
use orchestrate_core::ops::{Op, OpError, OutputDecl, OutputKind, Registry, RunContext};
use orchestrate_core::spec::{self, LoadOptions};
use orchestrate_core::store::Workspace;

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct FakeParams {
    #[serde(default = "one")]
    scale: f64,
}

fn one() -> f64 {
    1.0
}

/// Writes a file `report` and a folder `weights/` whose content depends on the `scale` param.
struct FakeTrain;

impl Op for FakeTrain {
    fn name(&self) -> &'static str {
        "fake.train"
    }
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "test op"
    }
    type Params = FakeParams;
    fn outputs(&self, _p: &FakeParams) -> Vec<OutputDecl> {
        vec![OutputDecl::file("report"), OutputDecl { kind: OutputKind::Dir, ..OutputDecl::file("weights") }]
    }
    fn numerical(&self) -> bool {
        true
    }
    fn run(&self, params: &FakeParams, ctx: &RunContext<'_>) -> Result<(), OpError> {
        // Counted per project (tests run in parallel): one line per run.
        let mut runs = std::fs::read_to_string(ctx.spec_dir.join("train-runs")).unwrap_or_default();
        runs.push_str("ran\n");
        std::fs::write(ctx.spec_dir.join("train-runs"), runs).map_err(|e| OpError::io("train-runs", e))?;
        let scale = params.scale;
        std::fs::write(ctx.output_path("report"), format!("scale={scale}\n")).map_err(|e| OpError::io("report", e))?;
        let w = ctx.output_path("weights");
        std::fs::create_dir_all(w.join("layer0")).map_err(|e| OpError::io("weights", e))?;
        std::fs::write(w.join("layer0/w.bin"), [scale as u8; 16]).map_err(|e| OpError::io("weights", e))?;
        std::fs::write(w.join("config.json"), "{}").map_err(|e| OpError::io("weights", e))?;
        Ok(())
    }
}

struct Collect(Vec<Event>);
impl Reporter for Collect {
    fn on_event(&mut self, e: &Event) {
        self.0.push(e.clone());
    }
}

fn env(device: &'static str) -> EnvProvider {
    Box::new(move || {
        Ok(EnvPart {
            device: device.into(),
            libtorch: "2.11.0".into(),
            cpu: Some("AVX2".into()),
            cpu_vendor: None,
            threads: Some(1),
        })
    })
}

fn setup() -> (tempfile::TempDir, spec::Spec, orchestrate_core::dag::Dag) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.yaml");
    std::fs::write(&path, "name: s\nnodes:\n  train:\n    op: fake.train\n    params: {scale: 3}\n").unwrap();
    let mut registry = Registry::builtin();
    registry.register(Arc::new(FakeTrain));
    let spec = spec::load(&path, &LoadOptions::default()).unwrap();
    let dag = orchestrate_core::dag::compile(&spec, &registry).unwrap();
    (dir, spec, dag)
}

fn opts(device: &'static str) -> RunOptions {
    RunOptions {
        jobs: 1,
        force: BTreeSet::new(),
        env: env(device),
        argv: "test".into(),
        slurm: None,
        remote: None,
        drop_states: false,
    }
}

#[test]
fn store_only_outputs_are_published_as_read_only_objects_and_reused() {
    let (dir, spec, dag) = setup();
    let ws = Workspace::open(&dir.path().join(".orchestrate")).unwrap();
    let result = exec::run(&ws, &spec, &dag, &opts("cpu"), &mut Collect(Vec::new())).unwrap();
    let Some(Outcome::Ran { outputs, .. }) = result.outcomes.get("train") else { panic!("train ran") };
    let weights = outputs.iter().find(|o| o.name == "weights").unwrap();
    assert_eq!(weights.object.files, 2);
    let obj = ws.object_path(&weights.object.hash);
    assert_eq!(std::fs::read(obj.join("layer0/w.bin")).unwrap(), vec![3u8; 16]);
    assert!(std::fs::metadata(obj.join("config.json")).unwrap().permissions().readonly());
    let report = outputs.iter().find(|o| o.name == "report").unwrap();
    assert_eq!(std::fs::read_to_string(ws.object_path(&report.object.hash)).unwrap(), "scale=3\n");

    let again = exec::run(&ws, &spec, &dag, &opts("cpu"), &mut Collect(Vec::new())).unwrap();
    assert!(matches!(again.outcomes["train"], Outcome::Cached { .. }));
    let runs = std::fs::read_to_string(dir.path().join("train-runs")).unwrap();
    assert_eq!(runs.lines().count(), 1, "the op ran once");
}

#[test]
fn a_numerical_nodes_key_includes_the_device_and_libtorch_version() {
    let (dir, spec, dag) = setup();
    let ws = Workspace::open(&dir.path().join(".orchestrate")).unwrap();
    exec::run(&ws, &spec, &dag, &opts("cpu"), &mut Collect(Vec::new())).unwrap();
    let same = plan(Some(&ws), &spec, &dag, &BTreeSet::new(), &env("cpu")).unwrap();
    assert!(matches!(same[0].state, PlanState::Cached { .. }));
    let other = plan(Some(&ws), &spec, &dag, &BTreeSet::new(), &env("cuda")).unwrap();
    match &other[0].state {
        PlanState::Run { reason, .. } => assert!(reason.contains("env.device: \"cpu\" → \"cuda\""), "{reason}"),
        s => panic!("expected a run on another device, got {s:?}"),
    }
}

#[test]
fn a_missing_store_object_is_noticed_and_the_node_reruns() {
    let (dir, spec, dag) = setup();
    let ws = Workspace::open(&dir.path().join(".orchestrate")).unwrap();
    let result = exec::run(&ws, &spec, &dag, &opts("cpu"), &mut Collect(Vec::new())).unwrap();
    let Some(Outcome::Ran { outputs, .. }) = result.outcomes.get("train") else { panic!() };
    let report = ws.object_path(&outputs.iter().find(|o| o.name == "report").unwrap().object.hash);
    std::fs::remove_file(&report).unwrap();
    let p = plan(Some(&ws), &spec, &dag, &BTreeSet::new(), &env("cpu")).unwrap();
    assert_eq!(
        p[0].state,
        PlanState::Run { key: p[0].state_key(), reason: "output 'report' is missing from the store".into() }
    );
    let again = exec::run(&ws, &spec, &dag, &opts("cpu"), &mut Collect(Vec::new())).unwrap();
    assert!(matches!(again.outcomes["train"], Outcome::Ran { .. }));
    assert!(report.exists());
}

trait StateKey {
    fn state_key(&self) -> Option<orchestrate_core::store::Key>;
}
impl StateKey for orchestrate_core::exec::plan::PlanEntry {
    fn state_key(&self) -> Option<orchestrate_core::store::Key> {
        match &self.state {
            PlanState::Run { key, .. } => key.clone(),
            PlanState::Cached { key } => Some(key.clone()),
            _ => None,
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct NoParams {}

/// Reads the `weights` input and writes the sum of its bytes.
struct FakeEval;

impl Op for FakeEval {
    fn name(&self) -> &'static str {
        "fake.eval"
    }
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "test op"
    }
    type Params = NoParams;
    fn outputs(&self, _p: &NoParams) -> Vec<OutputDecl> {
        vec![OutputDecl::file("score")]
    }
    fn run(&self, _params: &NoParams, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let mut reads = std::fs::read_to_string(ctx.spec_dir.join("eval-runs")).unwrap_or_default();
        reads.push_str("ran\n");
        std::fs::write(ctx.spec_dir.join("eval-runs"), reads).map_err(|e| OpError::io("eval-runs", e))?;
        let w = ctx.input_path("weights")?;
        let bytes = std::fs::read(w.join("layer0/w.bin")).map_err(|e| OpError::io("weights", e))?;
        let sum: u64 = bytes.iter().map(|&b| b as u64).sum();
        std::fs::write(ctx.output_path("score"), format!("{sum}\n")).map_err(|e| OpError::io("score", e))?;
        Ok(())
    }
}

fn setup_chain() -> (tempfile::TempDir, spec::Spec, orchestrate_core::dag::Dag) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.yaml");
    std::fs::write(
        &path,
        "name: s\nnodes:\n  train:\n    op: fake.train\n    params: {scale: 3}\n  eval:\n    op: fake.eval\n    inputs: {weights: 'train:weights'}\n",
    )
    .unwrap();
    let mut registry = Registry::builtin();
    registry.register(Arc::new(FakeTrain));
    registry.register(Arc::new(FakeEval));
    let spec = spec::load(&path, &LoadOptions::default()).unwrap();
    let dag = orchestrate_core::dag::compile(&spec, &registry).unwrap();
    (dir, spec, dag)
}

/// Flips a byte of a read-only store file, keeping its size (bit rot, or a hand edit).
fn flip_a_byte(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap();
    let dir_mode = std::fs::metadata(dir).unwrap().permissions().mode();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(path).unwrap();
    bytes[0] ^= 0x55;
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(dir_mode)).unwrap();
}

fn object_of(outcome: &Outcome, name: &str) -> orchestrate_core::store::OutputRecord {
    let outputs = match outcome {
        Outcome::Ran { outputs, .. } | Outcome::Cached { outputs, .. } => outputs,
        o => panic!("{o:?}"),
    };
    outputs.iter().find(|o| o.name == name).unwrap().clone()
}

#[test]
fn forcing_the_producer_repairs_an_object_whose_bytes_no_longer_hash_to_its_name() {
    let (dir, spec, dag) = setup();
    let ws = Workspace::open(&dir.path().join(".orchestrate")).unwrap();
    let result = exec::run(&ws, &spec, &dag, &opts("cpu"), &mut Collect(Vec::new())).unwrap();
    for name in ["report", "weights"] {
        let out = object_of(&result.outcomes["train"], name);
        let obj = ws.object_path(&out.object.hash);
        let file = if out.object.kind == OutputKind::Dir { obj.join("layer0/w.bin") } else { obj };
        flip_a_byte(&file);
    }
    let mut force = opts("cpu");
    force.force = ["train".to_string()].into();
    let again = exec::run(&ws, &spec, &dag, &force, &mut Collect(Vec::new())).unwrap();
    assert!(matches!(again.outcomes["train"], Outcome::Ran { .. }));
    let report = object_of(&again.outcomes["train"], "report");
    let (hash, _) = orchestrate_core::store::hash_file(&ws.object_path(&report.object.hash)).unwrap();
    assert_eq!(hash, report.object.hash, "the damaged file object was replaced");
    let weights = object_of(&again.outcomes["train"], "weights");
    let info = orchestrate_core::store::objects::hash_dir(&ws.object_path(&weights.object.hash)).unwrap();
    assert_eq!(info.hash, weights.object.hash, "the damaged folder object was replaced");
    assert_eq!(std::fs::read(ws.object_path(&weights.object.hash).join("layer0/w.bin")).unwrap(), vec![3u8; 16]);
}

#[test]
fn a_consumer_never_reads_a_damaged_input_object_and_the_next_run_heals_it() {
    let (dir, spec, dag) = setup_chain();
    let ws = Workspace::open(&dir.path().join(".orchestrate")).unwrap();
    let result = exec::run(&ws, &spec, &dag, &opts("cpu"), &mut Collect(Vec::new())).unwrap();
    let score = object_of(&result.outcomes["eval"], "score");
    let Outcome::Ran { key: eval_key, .. } = &result.outcomes["eval"] else { panic!() };
    assert_eq!(std::fs::read_to_string(ws.object_path(&score.object.hash)).unwrap(), "48\n");
    let weights = object_of(&result.outcomes["train"], "weights");
    flip_a_byte(&ws.object_path(&weights.object.hash).join("layer0/w.bin"));

    // The consumer is forced to run: it must not read the damaged bytes.
    let eval_runs = || std::fs::read_to_string(dir.path().join("eval-runs")).unwrap().lines().count();
    let reads = eval_runs();
    let mut force = opts("cpu");
    force.force = ["eval".to_string()].into();
    let damaged = exec::run(&ws, &spec, &dag, &force, &mut Collect(Vec::new())).unwrap();
    match &damaged.outcomes["eval"] {
        Outcome::Failed { error, .. } => {
            assert!(error.contains("'train'") && error.contains("weights") && error.contains("damaged"), "{error}")
        }
        o => panic!("the consumer of a damaged object must fail, got {o:?}"),
    }
    assert_eq!(eval_runs(), reads, "the op never ran on the damaged input");
    let row = ws.index().unwrap().lookup(eval_key).unwrap();
    assert!(row.is_some(), "the consumer's earlier, correct cache row is kept");

    // The next plain run re-runs the producer (its object was moved aside) and then the consumer is a hit again.
    let healed = exec::run(&ws, &spec, &dag, &opts("cpu"), &mut Collect(Vec::new())).unwrap();
    assert!(matches!(healed.outcomes["train"], Outcome::Ran { .. }), "{:?}", healed.outcomes["train"]);
    assert!(matches!(healed.outcomes["eval"], Outcome::Cached { .. }), "{:?}", healed.outcomes["eval"]);
    let info = orchestrate_core::store::objects::hash_dir(&ws.object_path(&weights.object.hash)).unwrap();
    assert_eq!(info.hash, weights.object.hash);
}
