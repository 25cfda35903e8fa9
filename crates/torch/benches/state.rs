//! Writing and reading a training state: prints figures, asserts nothing but
//! that both ways write the same bytes. Side by side in one process, on the
//! same tensors: the streamed writer and restore (`save_state`,
//! `restore_state`, which reads each tensor from the stream into the model's
//! own) and what they replaced (every tensor copied out whole, then
//! `safetensors::serialize` of the whole state in memory, then gzip; reading
//! the whole decompressed file, copying each tensor out of it, then into the model). For each:
//! seconds, and the peak resident memory above what the tensors themselves
//! take (Linux's VmHWM, reset between the two with /proc/self/clear_refs).
//!
//! `cargo bench --bench state` (100 M parameters, so 300 M f32 with the two
//! AdamW moments, 1.2 GB), or `cargo bench --bench state -- 494` for
//! Qwen2.5-0.5B's parameter count (5.9 GB; the old writer needs about 18 GB
//! more than that). `-- --restore STATE --model DIR` restores a real state into
//! its model instead (the 0.5B warm-start's, for docs/training.md).

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::time::Instant;

use orchestrate_torch::train::adamw::{AdamW, AdamWConfig};
use orchestrate_torch::train::common::{restore_state, save_state};
use tch::{Device, Kind, Tensor};

fn status(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = text.lines().find(|l| l.starts_with(field)).expect("field");
    line.split_whitespace().nth(1).and_then(|k| k.parse::<u64>().ok()).expect("kB") * 1024
}

/// Resets the high-water mark to the current resident size.
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").expect("clear_refs (Linux 4.0 or later)");
}

/// Runs `f`, returning its seconds and its peak RSS above the RSS before it.
fn measured(f: impl FnOnce()) -> (f64, u64) {
    reset_peak();
    let before = status("VmRSS:");
    let t = Instant::now();
    f();
    (t.elapsed().as_secs_f64(), status("VmHWM:").saturating_sub(before))
}

/// The writer before it streamed.
fn write_whole(path: &std::path::Path, params: &BTreeMap<String, Tensor>, adam: &AdamW, meta: &serde_json::Value) {
    let out = |t: &Tensor| -> (Vec<usize>, Vec<f32>) {
        let flat = t.detach().to_device(Device::Cpu).to_kind(Kind::Float).contiguous().view([-1]);
        (t.size().iter().map(|d| *d as usize).collect(), Vec::<f32>::try_from(&flat).expect("f32"))
    };
    let mut tensors = Vec::new();
    for (name, p) in params {
        for (prefix, t) in [("model", p), ("adam_m", &adam.exp_avg[name]), ("adam_v", &adam.exp_avg_sq[name])] {
            let (shape, v) = out(t);
            tensors.push((format!("{prefix}/{name}"), shape, v));
        }
    }
    let bytes: Vec<Vec<u8>> =
        tensors.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| {
            (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).expect("view"))
        })
        .collect();
    let mut metadata = HashMap::new();
    metadata.insert("orchestrate_state".to_string(), meta.to_string());
    let serialized = safetensors::tensor::serialize(views, Some(metadata)).expect("serialize");
    let mut gz = flate2::write::GzEncoder::new(std::fs::File::create(path).expect("file"), flate2::Compression::new(1));
    gz.write_all(&serialized).expect("write");
    gz.finish().expect("finish");
}

/// The reader before it streamed: the whole decompressed file, each tensor's
/// bytes copied out of it, then into values and a tensor, copied into the model.
fn restore_whole(path: &std::path::Path, params: &BTreeMap<String, Tensor>, adam: &AdamW) -> usize {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).expect("file")).read_to_end(&mut bytes).expect("read");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("state");
    let copies: BTreeMap<String, Vec<u8>> = st.tensors().into_iter().map(|(n, v)| (n, v.data().to_vec())).collect();
    tch::no_grad(|| {
        for (name, p) in params {
            for (prefix, t) in [("model", p), ("adam_m", &adam.exp_avg[name]), ("adam_v", &adam.exp_avg_sq[name])] {
                let raw = &copies[&format!("{prefix}/{name}")];
                let values: Vec<f32> =
                    raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                t.shallow_clone().copy_(&Tensor::from_slice(&values).view(t.size().as_slice()));
            }
        }
    });
    copies.len()
}

/// The metadata of an SFT state (what `restore_state` checks before reading tensors).
fn sft_meta() -> orchestrate_core::train::metrics::TrainingMetrics {
    use orchestrate_core::train::metrics::{Scheduler, SftIdentity, SftMetrics, TrainingMetrics};
    let p = serde_json::from_value(serde_json::json!({"branch": "warmstart", "epochs": 1})).expect("params");
    let m = SftMetrics {
        identity: SftIdentity::new(&p, "bench".into(), 1),
        next_epoch: 1,
        complete: false,
        updates: 0,
        adam_step: 0,
        scheduler: Scheduler { next_update: 0, total: 1 },
        history: Vec::new(),
        validation_history: Vec::new(),
        final_model_digest: "bench".into(),
        costs: None,
    };
    TrainingMetrics::Sft(m)
}

/// `-- --restore STATE --model DIR`: restores a real state (a node's `state`
/// output) into the model it was trained from, and prints the seconds and the
/// peak memory above the model and its AdamW moments.
fn restore_real(state: &str, model: &str) {
    use orchestrate_torch::train::common::{load_model, params};
    let (model, _) = load_model(std::path::Path::new(model), Device::Cpu).expect("the model folder");
    let params = params(&model);
    let mut adam = AdamW::new(AdamWConfig::new(0.01), &params);
    let count: i64 = params.values().map(|t| t.numel() as i64).sum();
    let held = status("VmRSS:") as f64 / 1e9;
    let (s, m) = measured(|| {
        restore_state(std::path::Path::new(state), "the state", &params, &mut adam, |_| Ok(())).expect("restore_state")
    });
    let file = std::fs::metadata(state).expect("the state").len() as f64 / 1e9;
    println!(
        "restore {state} ({file:.2} GB gzip) into a model of {count} parameters and its AdamW moments (RSS {held:.2} GB before): {s:.2} s, {:.3} GB above them",
        m as f64 / 1e9
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--restore") {
        let model = args.iter().position(|a| a == "--model").and_then(|j| args.get(j + 1)).expect("--model DIR");
        restore_real(args.get(i + 1).expect("--restore STATE"), model);
        return;
    }
    let millions: i64 =
        std::env::args().skip(1).find(|a| !a.starts_with('-')).and_then(|a| a.parse().ok()).unwrap_or(100);
    // A model's shape of tensors: one embedding-sized tensor, then 1 M blocks.
    let total = millions * 1_000_000;
    let mut params = BTreeMap::new();
    let embedding = total / 4;
    params.insert("embed".to_string(), Tensor::randn([embedding], (Kind::Float, Device::Cpu)));
    let mut left = total - embedding;
    let mut i = 0;
    while left > 0 {
        let n = left.min(1_000_000);
        params.insert(format!("layer.{i:04}"), Tensor::randn([n], (Kind::Float, Device::Cpu)));
        left -= n;
        i += 1;
    }
    let mut adam = AdamW::new(AdamWConfig::new(0.01), &params);
    for t in adam.exp_avg.values_mut().chain(adam.exp_avg_sq.values_mut()) {
        let _ = t.normal_(0.0, 1.0);
    }
    let meta = sft_meta();
    let dir = tempfile::tempdir().expect("temp dir");
    let (streamed, whole) = (dir.path().join("streamed"), dir.path().join("whole"));
    let state_gb = (3 * total * 4) as f64 / 1e9;
    println!("state: {millions} M parameters with two AdamW moments, {state_gb:.2} GB of f32, held by the tensors (RSS {:.2} GB)", status("VmRSS:") as f64 / 1e9);
    let (ws, wm) = measured(|| save_state(&streamed, &params, &adam, &meta).expect("save_state"));
    let meta_json = serde_json::to_value(&meta).expect("meta");
    let (os, om) = measured(|| write_whole(&whole, &params, &adam, &meta_json));
    let same = std::fs::read(&streamed).expect("read") == std::fs::read(&whole).expect("read");
    assert!(same, "the two writers wrote other bytes");
    let size = std::fs::metadata(&streamed).expect("size").len() as f64 / 1e9;
    let gb = |b: u64| b as f64 / 1e9;
    println!("write  streamed: {ws:.2} s, {:.3} GB above the tensors | whole: {os:.2} s, {:.2} GB above | memory ratio {:.4}, time ratio {:.2} (file {size:.2} GB, the same bytes)", gb(wm), gb(om), wm as f64 / om as f64, ws / os);
    let mut restored = AdamW::new(AdamWConfig::new(0.01), &params);
    let (rs, rm) = measured(|| {
        restore_state(&streamed, "the bench state", &params, &mut restored, |_| Ok(())).expect("restore_state")
    });
    let same = adam.exp_avg.iter().all(|(n, t)| t.equal(&restored.exp_avg[n]))
        && adam.exp_avg_sq.iter().all(|(n, t)| t.equal(&restored.exp_avg_sq[n]));
    assert!(same, "the restored moments are not the saved ones");
    let (ors, orm) = measured(|| {
        assert_eq!(restore_whole(&whole, &params, &restored), 3 * params.len());
    });
    println!(
        "restore streamed into the tensors: {rs:.2} s, {:.3} GB above them | whole file: {ors:.2} s, {:.2} GB above | memory ratio {:.4}, time ratio {:.2}",
        gb(rm),
        gb(orm),
        rm as f64 / orm as f64,
        rs / ors
    );
}
