//! Tests of the model against an independent reference (Hugging Face
//! transformers, run through the venv's Python) and of its own invariants.

use std::path::Path;
use std::process::Command;

use orchestrate_core::data::verifier::FinishReason;
use orchestrate_core::model::{HfFolder, ModelConfig};
use serde_json::Value;
use tch::{Device, Kind, Tensor};

use super::decoder::{attention_mask, CausalLm};
use super::generate::{generate, score, Sampling};

/// libtorch's intra-op thread pool is shared by the whole process: tests that
/// ran side by side would split it and change reduction order (and rounding).
/// Each test holds this lock while it computes, so its figures are the same on
/// every run; not while a reference runs in Python, a process of its own.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn python() -> String {
    std::env::var("ORCHESTRATE_PYTHON").unwrap_or_else(|_| {
        panic!("ORCHESTRATE_PYTHON is not set: run `bash scripts/setup.sh` and `. .setup/env.sh` (the parity tests need transformers)")
    })
}

/// The families the parity tests build with transformers (see hf_reference.py
/// for what each random config exercises).
const FAMILIES: [&str; 3] = ["qwen2", "qwen3", "llama"];

/// transformers' reference for families (hf_reference.py): one family is
/// written to `dir`, several each to `dir/FAMILY`. Returns each family's folder
/// and its reference.json.
fn hf_references(dir: &Path, families: &[&str]) -> Vec<(std::path::PathBuf, Value)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/hf_reference.py");
    let out = Command::new(python()).arg(&script).arg(dir).arg(families.join(",")).output().expect("python runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    families
        .iter()
        .map(|family| {
            let folder = if families.len() == 1 { dir.to_path_buf() } else { dir.join(family) };
            let reference = serde_json::from_str(&std::fs::read_to_string(folder.join("reference.json")).unwrap());
            (folder, reference.unwrap())
        })
        .collect()
}

fn hf_reference(dir: &Path) -> Value {
    hf_references(dir, &["qwen2"]).remove(0).1
}

fn ids_tensor(v: &Value) -> Tensor {
    let rows: Vec<Vec<i64>> = serde_json::from_value(v.clone()).unwrap();
    let (b, t) = (rows.len() as i64, rows[0].len() as i64);
    Tensor::from_slice(&rows.concat()).view([b, t])
}

pub fn tiny_config(vocab: usize) -> ModelConfig {
    serde_json::from_value(serde_json::json!({
        "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": true, "model_type": "qwen2"
    }))
    .unwrap()
}

fn tiny_model(seed: u64) -> CausalLm {
    let mut m = CausalLm::new(&tiny_config(96), Device::Cpu).unwrap();
    m.init_weights(seed);
    // Larger weights than the 0.02 init so the distributions are far from uniform.
    tch::no_grad(|| {
        for (_, mut t) in m.vs.variables() {
            let scaled = &t * 8.0;
            t.copy_(&scaled);
        }
    });
    m
}

/// Each family, on a random config transformers builds (one Python start for
/// all three): its logits and log-probabilities equal transformers' (a full
/// batch and a left-padded one), its parameter count is the one transformers
/// counts, and its greedy generation is transformers' token for token, with
/// and without the KV cache.
#[test]
fn every_family_matches_transformers_in_logits_log_probs_and_greedy_generation() {
    let dir = tempfile::tempdir().unwrap();
    let references = hf_references(dir.path(), &FAMILIES);
    let _serial = serial();
    for (family, (folder, reference)) in FAMILIES.into_iter().zip(references) {
        logits_match(family, &folder, &reference);
        greedy_matches(family, &folder, &reference);
    }
}

/// Logits and log-probabilities over a full batch and a left-padded one.
fn logits_match(family: &str, folder: &Path, reference: &Value) {
    assert_eq!(reference["family"], family);
    let model = CausalLm::load(&HfFolder { dir: folder.to_path_buf() }, Device::Cpu).unwrap();
    assert_eq!(model.config.family().unwrap().model_type(), family);
    assert_eq!(Some(model.config.parameter_count()), reference["parameters"].as_u64(), "{family}: parameters");
    for case in reference["cases"].as_array().unwrap() {
        let ids = ids_tensor(&case["ids"]);
        let mask = ids_tensor(&case["mask"]);
        let positions = (mask.cumsum(1, Kind::Int64) - 1).clamp_min(0);
        let ours = tch::no_grad(|| model.forward(&ids, &positions, &attention_mask(&mask, ids.size()[1]), None));
        let ours_logp = ours.log_softmax(-1, Kind::Float);
        let theirs: Vec<Vec<Vec<f32>>> = serde_json::from_value(case["logits"].clone()).unwrap();
        let masks: Vec<Vec<i64>> = serde_json::from_value(case["mask"].clone()).unwrap();
        let (mut worst, mut worst_logp) = (0f32, 0f32);
        for (b, rows) in theirs.iter().enumerate() {
            for (t, row) in rows.iter().enumerate() {
                if masks[b][t] == 0 {
                    continue; // padding positions are not part of the contract
                }
                let ours_row = Vec::<f32>::try_from(&ours.get(b as i64).get(t as i64)).unwrap();
                for (a, e) in ours_row.iter().zip(row) {
                    worst = worst.max((a - e).abs());
                }
                let theirs_logp = Vec::<f32>::try_from(&Tensor::from_slice(row).log_softmax(-1, Kind::Float)).unwrap();
                let ours_row = Vec::<f32>::try_from(&ours_logp.get(b as i64).get(t as i64)).unwrap();
                for (a, e) in ours_row.iter().zip(&theirs_logp) {
                    worst_logp = worst_logp.max((a - e).abs());
                }
            }
        }
        eprintln!(
            "parity {family}: max |ours - transformers| logits {worst:e}, log-probs {worst_logp:e} over {} rows",
            masks.len()
        );
        assert!(worst <= 1e-4, "{family}: max |ours - transformers| = {worst}");
        assert!(worst_logp <= 2e-4, "{family}: max log-prob error {worst_logp}");
    }
}

#[test]
fn a_sharded_checkpoint_loads_to_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    hf_reference(dir.path());
    let _serial = serial();
    let sharded = dir.path().join("sharded");
    assert!(sharded.join("model.safetensors.index.json").is_file(), "transformers wrote an index");
    let shards = HfFolder { dir: sharded.clone() }.weight_files().unwrap();
    assert!(shards.len() > 1, "several shards: {shards:?}");
    let a = CausalLm::load(&HfFolder { dir: dir.path().to_path_buf() }, Device::Cpu).unwrap();
    let b = CausalLm::load(&HfFolder { dir: sharded }, Device::Cpu).unwrap();
    let (va, vb) = (a.vs.variables(), b.vs.variables());
    for (name, t) in va {
        assert!(t.equal(&vb[&name]), "{name}");
    }
}

/// Greedy generation, token for token up to EOS, with and without the KV cache.
fn greedy_matches(family: &str, folder: &Path, reference: &Value) {
    let model = CausalLm::load(&HfFolder { dir: folder.to_path_buf() }, Device::Cpu).unwrap();
    let eos = reference["eos"].as_i64().unwrap();
    for case in reference["greedy"].as_array().unwrap() {
        let ids: Vec<Vec<i64>> = serde_json::from_value(case["ids"].clone()).unwrap();
        let masks: Vec<Vec<i64>> = serde_json::from_value(case["mask"].clone()).unwrap();
        let prompts: Vec<Vec<i64>> = ids
            .iter()
            .zip(&masks)
            .map(|(r, m)| r.iter().zip(m).filter(|(_, v)| **v == 1).map(|(i, _)| *i).collect())
            .collect();
        let expected: Vec<Vec<i64>> = serde_json::from_value(case["generated"].clone()).unwrap();
        for use_cache in [true, false] {
            let got = generate(&model, &prompts, 16, &[eos], &Sampling::Greedy, use_cache).unwrap();
            for (g, e) in got.iter().zip(&expected) {
                let until_eos: Vec<i64> = match e.iter().position(|t| *t == eos) {
                    Some(p) => e[..=p].to_vec(),
                    None => e.clone(),
                };
                assert_eq!(g.ids, until_eos, "{family}: use_cache={use_cache}");
            }
        }
    }
}

#[test]
fn behavior_logprobs_from_kv_cache_generation_equal_teacher_forced_scores() {
    let _serial = serial();
    let model = tiny_model(1);
    let prompts = vec![vec![5, 6, 7, 8, 9, 10], vec![11, 12, 13]];
    let sampling = Sampling::Sample { seed: 42, rollout_ids: vec![0, 1] };
    let out = generate(&model, &prompts, 24, &[3], &sampling, true).unwrap();
    let responses: Vec<Vec<i64>> = out.iter().map(|g| g.ids.clone()).collect();
    let scored = score(&model, &prompts, &responses).unwrap();
    let mut worst = 0f32;
    for (g, s) in out.iter().zip(&scored) {
        assert_eq!(g.behavior_logprobs.len(), s.len());
        for (a, b) in g.behavior_logprobs.iter().zip(s) {
            worst = worst.max((a - b).abs());
        }
    }
    eprintln!("behavior vs teacher-forced: max |diff| = {worst:e}");
    assert!(worst <= 2e-4, "max |behavior - teacher forced| = {worst}");
}

#[test]
fn sampling_depends_only_on_seed_rollout_id_and_position() {
    let _serial = serial();
    let model = tiny_model(2);
    let prompt = vec![vec![4, 5, 6, 7]];
    let run = |seed: u64, rollout: u64| {
        generate(&model, &prompt, 20, &[], &Sampling::Sample { seed, rollout_ids: vec![rollout] }, true)
            .unwrap()
            .remove(0)
    };
    assert_eq!(run(9, 0), run(9, 0), "same seed and rollout id: identical samples");
    assert_ne!(run(9, 0).ids, run(9, 1).ids, "another rollout id: an independent draw");
    assert_ne!(run(9, 0).ids, run(10, 0).ids, "another seed: an independent draw");
    assert_eq!(run(9, 0).finish, FinishReason::Length);
}

#[test]
fn a_batch_of_one_equals_the_same_row_in_a_batch_of_many() {
    let _serial = serial();
    let model = tiny_model(3);
    let prompts = vec![vec![4, 5, 6], vec![7, 8, 9, 10, 11, 12, 13], vec![14]];
    let all = generate(&model, &prompts, 16, &[], &Sampling::Sample { seed: 5, rollout_ids: vec![10, 11, 12] }, true)
        .unwrap();
    for (i, p) in prompts.iter().enumerate() {
        let alone = generate(
            &model,
            std::slice::from_ref(p),
            16,
            &[],
            &Sampling::Sample { seed: 5, rollout_ids: vec![10 + i as u64] },
            true,
        )
        .unwrap()
        .remove(0);
        assert_eq!(alone.ids, all[i].ids, "row {i}");
        for (a, b) in alone.behavior_logprobs.iter().zip(&all[i].behavior_logprobs) {
            assert!((a - b).abs() <= 2e-4, "row {i}: {a} vs {b}");
        }
    }
}

#[test]
fn kv_cache_and_full_recompute_choose_the_same_tokens() {
    let _serial = serial();
    let model = tiny_model(4);
    let prompts = vec![vec![4, 5, 6, 7, 8], vec![9, 10]];
    let s = Sampling::Sample { seed: 1, rollout_ids: vec![0, 1] };
    let cached = generate(&model, &prompts, 20, &[], &s, true).unwrap();
    let full = generate(&model, &prompts, 20, &[], &s, false).unwrap();
    for (a, b) in cached.iter().zip(&full) {
        assert_eq!(a.ids, b.ids);
    }
}

#[test]
fn saving_then_loading_round_trips_bit_exactly() {
    let _serial = serial();
    let model = tiny_model(5);
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let back = CausalLm::load(&HfFolder { dir: dir.path().to_path_buf() }, Device::Cpu).unwrap();
    let (a, b) = (model.vs.variables(), back.vs.variables());
    assert_eq!(a.len(), b.len());
    for (name, t) in a {
        assert!(t.equal(&b[&name]), "{name} differs after a round trip");
    }
    assert_eq!(back.config.vocab_size, 96);
}

#[test]
fn loading_refuses_a_wrong_shape_or_a_missing_weight() {
    let _serial = serial();
    let model = tiny_model(6);
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let mut config = tiny_config(96);
    config.intermediate_size = 64;
    std::fs::write(dir.path().join("config.json"), config.to_json()).unwrap();
    let err = CausalLm::load(&HfFolder { dir: dir.path().to_path_buf() }, Device::Cpu).err().unwrap().to_string();
    assert!(err.contains("has shape"), "{err}");
}

#[test]
fn a_config_that_implies_more_parameters_than_its_weights_hold_is_refused_before_anything_is_allocated() {
    let _serial = serial();
    let model = tiny_model(6);
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    // A config edited by hand (or from outside) to sizes the files do not hold:
    // 2 layers × 3 × 64 × 2^40 FP32 weights, far past any machine's memory.
    let mut config = tiny_config(96);
    config.intermediate_size = 1 << 40;
    std::fs::write(dir.path().join("config.json"), config.to_json()).unwrap();
    let err = CausalLm::load(&HfFolder { dir: dir.path().to_path_buf() }, Device::Cpu).err().unwrap().to_string();
    let stored = model.vs.variables().values().map(|t| t.numel() as u64).sum::<u64>();
    assert!(err.contains("config.json"), "{err}");
    assert!(err.contains(&format!("the weight files hold {stored} parameters")), "{err}");
    assert!(err.contains(&config.parameter_count().to_string()), "{err}");
}

#[test]
fn a_config_whose_weights_cannot_fit_in_this_machines_memory_is_refused_not_a_panic() {
    let _serial = serial();
    let mut config = tiny_config(96);
    config.intermediate_size = 1 << 40;
    let err = CausalLm::new(&config, Device::Cpu).err().unwrap().to_string();
    assert!(err.contains(&format!("{} parameters", config.parameter_count())), "{err}");
    assert!(err.contains("memory"), "{err}");
    // A config that fits is built as before.
    assert!(CausalLm::new(&tiny_config(96), Device::Cpu).is_ok());
}

#[test]
fn transformers_loads_what_we_write_and_computes_the_same_logits() {
    let dir = tempfile::tempdir().unwrap();
    let model = {
        let _serial = serial();
        let model = tiny_model(7);
        model.save(dir.path()).unwrap();
        model
    };
    let texts: Vec<String> = (0..50).map(|i| format!("stock {i} boxes {{\"final_stock\": {i}}}")).collect();
    orchestrate_core::model::build_bpe(&texts, 96, &dir.path().join("tokenizer.json")).unwrap();
    let ids: Vec<Vec<i64>> = vec![vec![3, 17, 40, 41, 90, 5, 6, 7]];
    std::fs::write(dir.path().join("ids.json"), serde_json::to_string(&ids).unwrap()).unwrap();
    let text = "<|im_start|>stock 12 boxes<|im_end|>";
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/hf_load.py");
    let out = Command::new(python())
        .arg(&script)
        .arg(dir.path())
        .arg(dir.path().join("ids.json"))
        .arg(text)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _serial = serial();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let theirs: Vec<Vec<Vec<f32>>> = serde_json::from_value(v["logits"].clone()).unwrap();
    let t = ids_tensor(&serde_json::to_value(&ids).unwrap());
    let positions = Tensor::arange(8, (Kind::Int64, Device::Cpu)).view([1, 8]);
    let ours = tch::no_grad(|| {
        model.forward(&t, &positions, &attention_mask(&Tensor::ones([1, 8], (Kind::Int64, Device::Cpu)), 8), None)
    });
    let mut worst = 0f32;
    for (p, row) in theirs[0].iter().enumerate() {
        let o = Vec::<f32>::try_from(&ours.get(0).get(p as i64)).unwrap();
        for (a, b) in o.iter().zip(row) {
            worst = worst.max((a - b).abs());
        }
    }
    eprintln!("transformers on our folder: max |diff| = {worst:e}");
    assert!(worst <= 1e-4, "{worst}");
    let tokenizer = orchestrate_core::model::TextTokenizer::from_file(&dir.path().join("tokenizer.json")).unwrap();
    let ours_ids = tokenizer.encode(text).unwrap();
    let theirs_ids: Vec<i64> = serde_json::from_value(v["encoded"].clone()).unwrap();
    assert_eq!(ours_ids, theirs_ids, "the tokenizers agree on the encoding");
}

/// Minor page faults of this thread so far.
fn thread_page_faults() -> i64 {
    // SAFETY: getrusage writes the struct it is given.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut u), 0);
        u.ru_minflt
    }
}

/// Touches every byte of a fresh allocation of `size`, frees it, and returns
/// the page faults that took.
fn faults_to_fill(size: usize, byte: u8) -> i64 {
    let before = thread_page_faults();
    // SAFETY: the allocation is checked, written within its size, then freed once.
    unsafe {
        let p = libc::malloc(size) as *mut u8;
        assert!(!p.is_null());
        std::ptr::write_bytes(p, byte, size);
        let p = std::hint::black_box(p);
        assert_eq!(std::ptr::read_volatile(p.add(size - 1)), byte);
        libc::free(p as *mut libc::c_void);
    }
    thread_page_faults() - before
}

/// (#36 item 4.) Once the worker has set the allocator up, a large buffer
/// freed and taken again reuses its pages: no fresh pages to fault in and
/// zero, which was a sixth of a 0.5B GRPO iteration. Measured in a process of
/// its own (this test binary again, this test alone): another test allocating
/// on the shared heap between the free and the second fill could split the
/// freed block and make the second fill fault for reasons of its own.
#[test]
fn a_large_buffer_freed_and_taken_again_reuses_its_pages() {
    const PROBE: &str = "ORCHESTRATE_ALLOCATOR_PROBE";
    const NAME: &str = "tests::a_large_buffer_freed_and_taken_again_reuses_its_pages";
    if std::env::var_os(PROBE).is_some() {
        assert!(
            crate::keep_freed_memory() || crate::user_sets_malloc(),
            "the allocator was not set up (glibc on Linux expected)"
        );
        // Far over glibc's largest mmap threshold (32 MiB), on a thread started
        // after the set-up, as the worker's are.
        let size = 256 << 20;
        let (first, again) =
            std::thread::spawn(move || (faults_to_fill(size, 1), faults_to_fill(size, 2))).join().unwrap();
        println!("page faults: {first} {again}");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
        .env(PROBE, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the probe failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let counts: Vec<i64> = stdout
        .lines()
        .find_map(|l| l.split_once("page faults: ").map(|(_, counts)| counts))
        .unwrap_or_else(|| panic!("the probe printed no page faults:\n{stdout}"))
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect();
    let (first, again) = (counts[0], counts[1]);
    eprintln!("page faults: {first} filling 256 MiB the first time, {again} the second");
    assert!(first > 0, "the first fill faults its pages in");
    assert!(again * 10 < first, "the second fill faulted {again} pages (the first {first}): its memory was not reused");
}

/// Asks libtorch for a CUDA tensor and returns its refusal (there is no GPU
/// where these tests run; with one, the tensor is made and this says so).
fn cuda_tensor_refusal() -> String {
    match Tensor::f_zeros([1], (Kind::Float, Device::Cuda(0))) {
        Ok(_) => "made a CUDA tensor".to_string(),
        Err(e) => e.to_string().lines().next().unwrap_or_default().to_string(),
    }
}

/// The worker's CUDA half loads at run time (`load_cuda`): from the same
/// libtorch folder as the CPU half, and then libtorch really has its CUDA
/// backend (a CUDA tensor is refused for want of a driver, not for want of
/// CUDA kernels), where without it libtorch knows no CUDA at all. Each case in
/// a process of its own (this test binary again): libtorch settles once per
/// process whether CUDA exists.
#[test]
fn libtorch_cuda_loads_at_run_time_beside_the_cpu_half_and_brings_the_cuda_backend() {
    const PROBE: &str = "ORCHESTRATE_CUDA_LOAD_PROBE";
    const NAME: &str = "tests::libtorch_cuda_loads_at_run_time_beside_the_cpu_half_and_brings_the_cuda_backend";
    if let Some(driver) = std::env::var_os(PROBE) {
        let loaded = crate::load_cuda_with(driver == "driver").unwrap();
        println!("loaded: {loaded:?}");
        println!("refusal: {}", cuda_tensor_refusal());
        return;
    }
    let probe = |driver: &str| {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
            .env(PROBE, driver)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "the probe failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let line = |key: &str| {
            stdout
                .lines()
                .find_map(|l| l.split_once(key).map(|(_, value)| value.to_string()))
                .unwrap_or_else(|| panic!("the probe printed no '{key}':\n{stdout}"))
        };
        (line("loaded: "), line("refusal: "))
    };
    let lib = Path::new(env!("ORCHESTRATE_LIBTORCH_LIB"));
    let (without, refused_without) = probe("none");
    let (with, refused_with) = probe("driver");
    if !lib.join("libtorch_cuda.so").exists() {
        assert_eq!((without.as_str(), with.as_str()), ("NotInstalled", "NotInstalled"));
        return;
    }
    assert_eq!(without, "NoDriver");
    assert_eq!(with, format!("Loaded({:?})", lib.join("libtorch_cuda.so")));
    eprintln!("without the CUDA half: {refused_without}\nwith it: {refused_with}");
    assert_ne!(refused_without, refused_with, "loading libtorch_cuda changed nothing libtorch does");
    assert!(refused_with.contains("NVIDIA driver"), "{refused_with}");
}
