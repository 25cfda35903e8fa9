//! Ops whose outputs live only in the store, and the numerical environment part of keys.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use orchestrate_core::dag::key::EnvPart;
use orchestrate_core::exec::plan::{plan, PlanState};
use orchestrate_core::exec::report::Reporter;
use orchestrate_core::exec::{self, EnvProvider, Event, Outcome, RunOptions};
use orchestrate_core::ops::{Op, OpError, OutputDecl, OutputKind, Registry, RunContext};
use orchestrate_core::spec::{self, LoadOptions};
use orchestrate_core::store::Workspace;

static RUNS: AtomicUsize = AtomicUsize::new(0);

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
        RUNS.fetch_add(1, Ordering::SeqCst);
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
        Ok(EnvPart { device: device.into(), libtorch: "2.11.0".into(), cpu: Some("AVX2".into()), cpu_vendor: None })
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
    RunOptions { jobs: 1, force: BTreeSet::new(), env: env(device), argv: "test".into(), slurm: None }
}

#[test]
fn store_only_outputs_are_published_as_read_only_objects_and_reused() {
    let (dir, spec, dag) = setup();
    let ws = Workspace::open(&dir.path().join(".orchestrate")).unwrap();
    let before = RUNS.load(Ordering::SeqCst);
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
    assert_eq!(RUNS.load(Ordering::SeqCst), before + 1, "the op ran once");
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
