//! `orchestrate compare`: two runs that differ in one param show that param
//! and the inputs it changed downstream, nothing else; a run's matrix grouped
//! over seeds gives the mean, sample std and n that the test recomputes from
//! the nodes' own files.

use crate::common;

use common::{stderr, stdout, Project, CHAIN};
use serde_json::Value;

fn run_ids(p: &Project) -> Vec<String> {
    let out = p.run(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    // Newest first; oldest first here.
    let mut ids: Vec<String> =
        v["runs"].as_array().unwrap().iter().map(|r| r["run_id"].as_str().unwrap().into()).collect();
    ids.reverse();
    ids
}

fn compare_json(p: &Project, args: &[&str]) -> Value {
    let mut full = vec!["compare", "--json"];
    full.extend_from_slice(args);
    let out = p.run(&full);
    assert_eq!(out.status.code(), Some(0), "compare {args:?}: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

fn key_rows(c: &Value) -> Vec<(String, String, Vec<Value>)> {
    c["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["node"].as_str().unwrap().into(),
                r["field"].as_str().unwrap().into(),
                r["values"].as_array().unwrap().clone(),
            )
        })
        .collect()
}

#[test]
fn two_runs_differing_in_one_param_show_that_param_and_the_inputs_it_changed_downstream_only() {
    let p = Project::new();
    p.write("chain.yaml", CHAIN);
    p.run_json(&["chain.yaml"], 0);
    p.run_json(&["chain.yaml", "--set", "nodes.a.params.cmd=echo beta > a.txt"], 0);
    let [first, second] = run_ids(&p).try_into().unwrap();
    let c = compare_json(&p, &[&first, &second]);
    let rows = key_rows(&c);
    let fields: Vec<(&str, &str)> = rows.iter().map(|(n, f, _)| (n.as_str(), f.as_str())).collect();
    // a's param; b and c through the content of their inputs; d not at all.
    assert_eq!(fields, [("a", "params.cmd"), ("b", "input dep:a.txt"), ("c", "input dep:b.txt")], "{c:#}");
    assert_eq!(rows[0].2, [Value::from("\"echo alpha > a.txt\""), Value::from("\"echo beta > a.txt\"")]);
    // The input is named by the output that produced it on each side, with its content hash.
    let b = rows[1].2.iter().map(|v| v.as_str().unwrap()).collect::<Vec<_>>();
    assert!(b[0].starts_with("a:a.txt ") && b[1].starts_with("a:a.txt ") && b[0] != b[1], "{b:?}");
    assert!(c["metrics"].as_array().unwrap().is_empty() && c["gates"].as_array().unwrap().is_empty());

    // --all shows the unchanged node too, with the same key on both sides.
    let all = compare_json(&p, &[&first, &second, "--all"]);
    let d: Vec<_> = key_rows(&all).into_iter().filter(|(n, _, _)| n == "d").collect();
    let key = d.iter().find(|(_, f, _)| f == "key").expect("d's key row");
    assert_eq!(key.2[0], key.2[1]);
    assert!(d.iter().any(|(_, f, v)| f == "params.cmd" && v[0] == v[1]));

    // The text layout: one row per node and field, unchanged rows hidden.
    let out = p.run(&["compare", &first, &second]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(text.contains("a     params.cmd       \"echo alpha > a.txt\" → \"echo beta > a.txt\""), "{text}");
    assert!(!text.lines().any(|l| l.trim_start().starts_with("d ")), "{text}");
    // The spec names its latest run; Markdown for a pull request.
    let md = p.run(&["compare", &first, "chain.yaml", "--md"]);
    let md = stdout(&md);
    assert!(md.contains("| a | params.cmd | \"echo alpha > a.txt\" | \"echo beta > a.txt\" |"), "{md}");
}

#[test]
fn what_cannot_be_found_is_a_usage_error_naming_it() {
    let p = Project::new();
    p.write("chain.yaml", CHAIN);
    p.run_json(&["chain.yaml"], 0);
    let out = p.run(&["compare", "nosuchrun", "chain.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("'nosuchrun' is neither a pack folder"), "{}", stderr(&out));
    let out = p.run(&["compare", "chain.yaml", "--profile", "gpu"]);
    assert_eq!(out.status.code(), Some(2));
    let out = p.run(&["compare", "chain.yaml", "--group-by", "seed"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no node") && stderr(&out).contains("'seed'"), "{}", stderr(&out));
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    (m, (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0)).sqrt())
}

fn output(p: &Project, what: &str) -> Value {
    let out = p.run(&["path", "seeds.yaml", what]);
    assert_eq!(out.status.code(), Some(0), "{what}: {}", stderr(&out));
    serde_json::from_str(&std::fs::read_to_string(stdout(&out).trim()).unwrap()).unwrap()
}

#[cfg(feature = "torch")]
#[test]
fn a_three_seed_matrix_grouped_by_seed_gives_mean_std_and_n_and_a_paired_interval() {
    let p = Project::new();
    p.write(
        "seeds.yaml",
        r#"
name: seeds
nodes:
  data:
    op: dataset.stock_arithmetic
    params: {seed: 0, train: 60, validation: 8, test_id50: 4, test_ood100: 4, warmstart: 8}
  tokenizer:
    op: tokenizer.build
    inputs: {pages: 'data:pages.train', labels: 'data:labels.train'}
    params: {vocab_size: 400}
  base:
    op: model.init
    matrix: {seed: [0, 1, 2]}
    inputs: {tokenizer: 'tokenizer:tokenizer'}
    params: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1}
  grpo:
    op: train.grpo
    matrix: {seed: [0, 1, 2]}
    inputs: {model: 'base@seed=${matrix.seed}:model', pages: 'data:pages.train', labels: 'data:labels.train'}
    params: {iterations: 2, max_new_tokens: 8, lr: 1.0e-3}
  eval:
    op: eval.generate
    matrix: {seed: [0, 1, 2], policy: {labels: [base, grpo]}}
    inputs: {model: '${matrix.policy}@seed=${matrix.seed}:model', pages: 'data:pages.test'}
    params: {draws: 0, max_new_tokens: 8}
  # Label-only axes: eval.score has no seed param, and its policy param is not
  # the axis's (the labels only pair each score with its evaluation).
  score:
    op: eval.score
    matrix: {seed: {labels: [0, 1, 2]}, policy: {labels: [base, grpo]}}
    inputs:
      responses: 'eval@policy=${matrix.policy},seed=${matrix.seed}:responses'
      summary: 'eval@policy=${matrix.policy},seed=${matrix.seed}:summary'
      labels: 'data:labels.test'
"#,
    );
    p.run_json(&["seeds.yaml"], 0);
    let g = compare_json(&p, &["seeds.yaml", "--group-by", "seed"]);
    assert_eq!(g["axis"], "seed");
    let rows = g["rows"].as_array().unwrap();
    let row = |group: &str, metric: &str| -> &Value {
        rows.iter()
            .find(|r| r["group"] == group && r["metric"] == metric)
            .unwrap_or_else(|| panic!("no row {group} / {metric}: {g:#}"))
    };
    // The gradient norm differs by seed: recomputed from each seed's metrics file.
    let norms: Vec<f64> = (0..3)
        .map(|s| {
            let m = output(&p, &format!("grpo@seed={s}:metrics"));
            let all: Vec<f64> = m["history"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|h| h["updates"].as_array().unwrap().iter().map(|u| u["grad_norm"].as_f64().unwrap()))
                .collect();
            all.iter().sum::<f64>() / all.len() as f64
        })
        .collect();
    let (m, sd) = mean_std(&norms);
    let r = row("grpo", "gradient norm (mean per update)");
    assert_eq!(r["n"], 3);
    assert_eq!(r["members"], serde_json::json!(["0", "1", "2"]));
    assert!((r["mean"].as_f64().unwrap() - m).abs() < 1e-12, "{r} vs {m}");
    assert!((r["std"].as_f64().unwrap() - sd).abs() < 1e-12, "{r} vs {sd}");
    assert!(sd > 0.0, "three seeds, three norms: {norms:?}");
    // Greedy success per policy, grouped over seeds.
    let success = |policy: &str, s: usize| output(&p, &format!("score@policy={policy},seed={s}:results"));
    let r = row("score@policy=grpo", "greedy success ALL");
    let vals: Vec<f64> =
        (0..3).map(|s| success("grpo", s)["greedy"]["ALL"]["success_rate"].as_f64().unwrap()).collect();
    assert!((r["mean"].as_f64().unwrap() - vals.iter().sum::<f64>() / 3.0).abs() < 1e-12);
    // The sampled rates are undefined (draws: 0): undefined stays undefined, never 0.
    let r = row("score@policy=grpo", "sample success ALL");
    assert_eq!((r["n"].clone(), r["undefined"].clone(), r["mean"].clone()), (0.into(), 3.into(), Value::Null), "{r}");

    // The paired difference grpo − base over the same problems, each problem's
    // success its mean over the seeds.
    let paired = g["paired"].as_array().unwrap();
    let all = paired.iter().find(|r| r["population"] == "ALL").expect("a paired row");
    assert_eq!(
        (all["baseline"].as_str(), all["group"].as_str()),
        (Some("score@policy=base"), Some("score@policy=grpo"))
    );
    let per_problem = |policy: &str| -> std::collections::BTreeMap<String, f64> {
        let mut sums = std::collections::BTreeMap::new();
        for s in 0..3 {
            for (id, o) in success(policy, s)["greedy_problems"].as_object().unwrap() {
                *sums.entry(id.clone()).or_insert(0.0) += if o["correct"] == true { 1.0 / 3.0 } else { 0.0 };
            }
        }
        sums
    };
    let (base, grpo) = (per_problem("base"), per_problem("grpo"));
    assert_eq!(all["problems"], 8);
    let expected = base.keys().map(|k| grpo[k] - base[k]).sum::<f64>() / base.len() as f64;
    let d = &all["difference"];
    assert!((d["estimate"].as_f64().unwrap() - expected).abs() < 1e-12, "{d} vs {expected}");
    assert!(d["low"].as_f64().unwrap() <= expected && expected <= d["high"].as_f64().unwrap(), "{d}");
    // Text: mean, std and n per group.
    let out = p.run(&["compare", "seeds.yaml", "--group-by", "seed"]);
    assert!(stdout(&out).contains("grouped by seed"), "{}", stdout(&out));

    // The report draws the three seeds as one mean line with a band.
    let out = p.run(&["report", "seeds.yaml", "--group-by", "seed", "--out", "g.html"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let html = p.read("g.html");
    let grpo = html.split("<section id=\"grpo\">").nth(1).unwrap().split("</section>").next().unwrap();
    assert!(grpo.contains("<h3>grpo</h3>") && !grpo.contains("grpo@seed="), "one group, not three nodes: {grpo}");
    assert_eq!(grpo.matches("<figure>").count(), 6);
    assert_eq!(grpo.matches("(A n=3)").count(), 6, "{grpo}");
    // Gradient norms differ by seed (checked above): that chart has a band.
    let norm = grpo.split("<figure>").find(|f| f.contains("gradient norm")).unwrap();
    assert!(norm.contains("class=\"band\""), "{norm}");
}

/// A run is read with the results it had. `run --force` of a node whose
/// command does not give the same bytes twice replaces the stored result of
/// its key; the earlier run still made, and was judged on, its own bytes, so
/// its report and a comparison of the two runs show each run's own value
/// (before, both showed the later one, and compare called them equal).
#[test]
fn a_run_is_read_with_its_own_results_after_a_later_run_replaced_them() {
    let p = Project::new();
    let counter = p.path().join("counter");
    std::fs::write(&counter, "0\n").unwrap();
    let c = counter.to_str().unwrap();
    p.write(
        "s.yaml",
        &format!(
            "name: s\nnodes:\n  measure:\n    op: shell\n    params:\n      cmd: \"n=$(( $(cat {c}) + 1 )); echo $n > {c}; echo '{{\\\"score\\\": 0.6'$n'}}' > m.json\"\n      outs: [m.json]\n      metrics: [m.json]\n"
        ),
    );
    p.run_json(&["s.yaml"], 0);
    p.run_json(&["s.yaml", "--force", "measure"], 0);
    let [first, second] = run_ids(&p).try_into().unwrap();
    let object = std::path::PathBuf::from(stdout(&p.run(&["path", "s.yaml", "measure:m.json"])).trim());
    assert_eq!(std::fs::read_to_string(object).unwrap(), "{\"score\": 0.62}\n", "the second run's result is stored");

    let html = p.path().join("r.html");
    let out = p.run(&["report", &first, "--out", html.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(text.contains("0.61") && !text.contains("0.62"), "the first run's report shows another run's result");

    let c = compare_json(&p, &[&first, &second]);
    let score = c["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m.to_string().contains("score"))
        .unwrap_or_else(|| panic!("compare shows no change in the score: {c:#}"));
    let said = score.to_string();
    assert!(said.contains("0.61") && said.contains("0.62"), "{said}");
    // Under one key: the output that differs is named, with each side's object.
    let hashes = |run: &str| {
        let out = p.run(&["status", "--run", run, "--json"]);
        let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
        v["nodes"][0]["outputs"][0]["hash"].as_str().unwrap().to_string()
    };
    let (a, b) = (hashes(&first), hashes(&second));
    assert_ne!(a, b);
    let rows = c["outputs"].as_array().unwrap_or_else(|| panic!("no outputs section: {c:#}"));
    assert_eq!(rows.len(), 1, "{c:#}");
    assert_eq!((rows[0]["node"].as_str(), rows[0]["output"].as_str()), (Some("measure"), Some("m.json")));
    assert_eq!(rows[0]["values"], serde_json::json!([&a[..12], &b[..12]]));
    let text = stdout(&p.run(&["compare", &first, &second]));
    assert!(text.contains(&format!("measure  m.json  {} → {}", &a[..12], &b[..12])), "{text}");

    // `gc --keep-runs 2` keeps both runs whole: the first run's own bytes too.
    let out = p.run(&["gc", "s.yaml", "--keep-runs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = p.run(&["compare", &first, &second, "--json"]);
    let said = stdout(&out);
    assert!(said.contains("0.61") && said.contains("0.62"), "gc --keep-runs 2 removed the first run's result: {said}");
    // A plain gc keeps the latest run: the first run's result is gone, and its report says so.
    let out = p.run(&["gc", "s.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = p.run(&["report", &first, "--out", html.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(!text.contains("0.62") && text.contains("no longer in the store"), "{text}");
}
