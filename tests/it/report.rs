//! `orchestrate report` on the committed pack and on a workspace run.

use crate::common;

use common::{stderr, stdout, Project};

fn sections(html: &str) -> Vec<&str> {
    html.split("<section id=\"").skip(1).filter_map(|s| s.split('"').next()).collect()
}

#[test]
fn the_report_of_the_committed_pack_has_every_section_and_its_own_figures() {
    let p = Project::new();
    let pack = format!("{}/artifacts/grpo-main-tiny/v0.2.0", env!("CARGO_MANIFEST_DIR"));
    let out_path = p.path().join("pack.html");
    let out = p.run(&["report", &pack, "--out", out_path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let html = std::fs::read_to_string(&out_path).unwrap();
    assert_eq!(sections(&html), ["dag", "grpo", "sft", "evaluation", "costs", "gates", "faults"]);
    assert!(!html.contains("<script"), "no script");
    assert!(!html.contains("src=\"http"), "nothing fetched from the network");

    // One box per node of the manifest, coloured by its outcome in the sealed events.
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{pack}/MANIFEST.json")).unwrap()).unwrap();
    let nodes = manifest["nodes"].as_array().unwrap();
    let dag = html.split("<section id=\"dag\">").nth(1).unwrap().split("</section>").next().unwrap();
    assert_eq!(dag.matches("<rect").count(), nodes.len());
    for n in nodes {
        assert!(dag.contains(&format!("<title>{} (", n["id"].as_str().unwrap())), "{}", n["id"]);
    }
    // Every gate result of the pack, with its verdict.
    let gates: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{pack}/outputs/gates/gates.json")).unwrap()).unwrap();
    let results = gates["results"].as_array().unwrap();
    let section = html.split("<section id=\"gates\">").nth(1).unwrap().split("</section>").next().unwrap();
    for g in results {
        assert!(section.contains(g["name"].as_str().unwrap()));
    }
    let passed = results.iter().filter(|g| g["passed"] == true).count();
    assert_eq!(section.matches(">PASS<").count(), passed);
    // The evaluation rows of the results table, and the GRPO curves (6 per GRPO node).
    let table: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{pack}/outputs/results/table.json")).unwrap()).unwrap();
    let eval = html.split("<section id=\"evaluation\">").nth(1).unwrap().split("</section>").next().unwrap();
    let rows_table = eval.split("</table>").next().unwrap();
    assert_eq!(rows_table.matches("<tr>").count() - 1, table["rows"].as_array().unwrap().len());
    // Its reward trend and paired comparisons, each with the interval the table holds.
    let interval = |d: &serde_json::Value| {
        let f = |k: &str| format!("{:+.3}", d[k].as_f64().unwrap());
        format!("{} [{}, {}]", f("estimate"), f("low"), f("high"))
    };
    let trends = table["reward_trends"].as_array().unwrap();
    let comparisons = table["comparisons"].as_array().unwrap();
    assert!(!trends.is_empty() && !comparisons.is_empty(), "v0.2.0's table has both");
    let of_class = |class: &str| {
        let start = eval.find(&format!("<table class=\"{class}\">")).unwrap_or_else(|| panic!("no {class} table"));
        eval[start..].split("</table>").next().unwrap()
    };
    let (trend_table, paired_table) = (of_class("trends"), of_class("paired"));
    for t in trends {
        let row = format!("<tr><td>{}</td>", t["run"].as_str().unwrap());
        let at = trend_table.find(&row).unwrap_or_else(|| panic!("no trend row {row}"));
        let line = trend_table[at..].lines().next().unwrap();
        assert!(line.contains(&interval(&t["difference"])), "{line}");
    }
    for c in comparisons {
        let row = format!(
            "<tr><td>{} vs {}</td><td>{}</td><td>{}</td>",
            c["policy"].as_str().unwrap(),
            c["baseline"].as_str().unwrap(),
            c["population"].as_str().unwrap(),
            c["problems"]
        );
        let at = paired_table.find(&row).unwrap_or_else(|| panic!("no comparison row {row}"));
        let line = paired_table[at..].lines().next().unwrap();
        assert!(line.contains(&interval(&c["difference"])), "{line}");
    }
    assert_eq!(eval.matches("same problems</th>").count(), 1, "greedy only: v0.2.0 has no per-draw comparison");
    let grpo_nodes = nodes.iter().filter(|n| n["op"] == "train.grpo").count();
    let grpo = html.split("<section id=\"grpo\">").nth(1).unwrap().split("</section>").next().unwrap();
    assert_eq!(grpo.matches("<figure>").count(), 6 * grpo_nodes);
    for title in [
        "mean reward",
        "zero-variance group fraction",
        "mean exact KL",
        "clip fraction",
        "gradient norm",
        "learning rate",
    ] {
        assert!(grpo.contains(title), "{title}");
    }
}

#[test]
fn a_missing_target_is_a_clear_error_and_writes_nothing() {
    let p = Project::new();
    let out_path = p.path().join("r.html");
    let out = p.run(&["report", "no-such-run", "--out", out_path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no-such-run"), "{}", stderr(&out));
    assert!(!out_path.exists());
    let _ = stdout(&out);
}

/// Renders a report in headless Chromium (Debian's `chromium`, which
/// scripts/test.sh installs when it can): no console message at all (the report
/// has no script, so any is an error), and a screenshot in the test's folder.
#[test]
fn the_report_renders_in_headless_chromium_without_console_errors() {
    let p = Project::new();
    let pack = format!("{}/artifacts/grpo-main-tiny/v0.2.0", env!("CARGO_MANIFEST_DIR"));
    let html = p.path().join("pack.html");
    assert_eq!(p.run(&["report", &pack, "--out", html.to_str().unwrap()]).status.code(), Some(0));
    render_in_chromium(&html, &p.path().join("report.png"), "1600,4000");
}

/// Renders `html` in headless Chromium: no console message at all (a report
/// has no script, so any is an error), and a screenshot of it at `shot`.
fn render_in_chromium(html: &std::path::Path, shot: &std::path::Path, size: &str) {
    let out = std::process::Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("--window-size={size}"))
        .arg(format!("file://{}", html.display()))
        .output()
        .expect("headless Chromium not found: install Debian's `chromium` (scripts/test.sh does when it can)");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(!log.contains(":CONSOLE") && !log.contains("Uncaught"), "console messages: {log}");
    assert!(std::fs::metadata(shot).unwrap().len() > 10_000, "a screenshot was produced");
}

/// Two packs overlaid: one line per pack in each chart, a legend naming both;
/// what v0.1.0 cannot give (its metrics predate the shared type) is named in
/// red, not drawn. Rendered in headless Chromium like the single report.
#[test]
fn two_packs_overlay_their_curves_with_a_legend_and_render_in_chromium() {
    let p = Project::new();
    let root = env!("CARGO_MANIFEST_DIR");
    let (new, old) =
        (format!("{root}/artifacts/grpo-main-tiny/v0.2.0"), format!("{root}/artifacts/grpo-main-tiny/v0.1.0"));
    let html = p.path().join("overlay.html");
    let out = p.run(&["report", &new, &old, "--out", html.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(
        text.contains(&format!("<b>A</b>: pack {new}")) && text.contains(&format!("<b>B</b>: pack {old}")),
        "legend"
    );
    assert!(text.contains("grpo@mode=continuous on B: the metrics cannot be read"), "named in red");
    let grpo = text.split("<section id=\"grpo\">").nth(1).unwrap().split("</section>").next().unwrap();
    // grpo@mode=continuous, grpo@mode=interrupt, grpo-resume: six charts each, one line (A's colour) per chart.
    assert_eq!(grpo.matches("<figure>").count(), 18, "{grpo}");
    assert_eq!(grpo.matches("stroke=\"#1565c0\"").count(), 18);
    assert!(!grpo.contains("stroke=\"#c62828\""), "nothing drawn for B");
    assert!(!text.contains("<script"));
    render_in_chromium(&html, &p.path().join("overlay.png"), "1600,3000");
}

/// v0.1.0 was frozen before the training metrics had one shared type: its
/// report says which file and field it cannot read instead of drawing from defaults.
#[test]
fn the_report_of_a_pack_with_an_older_metrics_format_says_what_it_cannot_read() {
    let p = Project::new();
    let pack = format!("{}/artifacts/grpo-main-tiny/v0.1.0", env!("CARGO_MANIFEST_DIR"));
    let out_path = p.path().join("old.html");
    let out = p.run(&["report", &pack, "--out", out_path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let html = std::fs::read_to_string(&out_path).unwrap();
    let grpo = html.split("<section id=\"grpo\">").nth(1).unwrap().split("</section>").next().unwrap();
    assert!(grpo.contains("grpo@mode=continuous/metrics: field") && grpo.contains("cannot be read"), "{grpo}");
    assert!(!grpo.contains("<figure>"), "nothing drawn from a file that does not read");
    // What does not depend on the metrics is still there.
    let gates = html.split("<section id=\"gates\">").nth(1).unwrap().split("</section>").next().unwrap();
    assert_eq!(gates.matches(">PASS<").count(), 6);
}

/// A pack whose event log is missing is not a pack whose nodes all say "frozen".
#[test]
fn the_report_of_a_pack_without_its_event_log_fails_naming_it() {
    let p = Project::new();
    let src = std::path::PathBuf::from(format!("{}/artifacts/grpo-main-tiny/v0.2.0", env!("CARGO_MANIFEST_DIR")));
    let copy = p.path().join("pack");
    let status = std::process::Command::new("cp").arg("-r").arg(&src).arg(&copy).status().unwrap();
    assert!(status.success());
    std::fs::remove_file(copy.join("events.jsonl")).unwrap();
    let out_path = p.path().join("r.html");
    let out = p.run(&["report", copy.to_str().unwrap(), "--out", out_path.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("events.jsonl"), "{}", stderr(&out));
    assert!(!out_path.exists(), "no report written");
}

/// A shell node's own series and metrics (#31): before, `report` had only the
/// DAG and costs for them. Two runs overlaid draw one line per run in each of
/// the six nodes' `loss` chart; the single report lists the metrics (a string
/// as undefined, never 0) and draws the series; both render in Chromium.
#[test]
fn a_shell_nodes_series_are_drawn_and_overlaid_across_runs() {
    let p = Project::new();
    p.write("train.py", common::TRAINER);
    p.write("s.yaml", common::TRL_SWEEP);
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "s.yaml", "--json"];
        args.extend_from_slice(extra);
        let out = p.run(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        common::events(&out)[0]["run_id"].as_str().unwrap().to_string()
    };
    let a = run(&[]);
    let b = run(&["--set", "nodes.train.params.env.SCALE=2"]);
    let one = p.path().join("one.html");
    assert_eq!(p.run(&["report", &a, "--out", one.to_str().unwrap()]).status.code(), Some(0));
    let html = std::fs::read_to_string(&one).unwrap();
    let section = html.split("<section id=\"series\">").nth(1).unwrap().split("</section>").next().unwrap();
    assert_eq!(section.matches("<h3>train@").count(), 6, "{section}");
    assert_eq!(section.matches("<figcaption>loss</figcaption>").count(), 6, "{section}");
    // What the trainer wrote for LR 0.2, seed 1 (it rounds to 8 decimals).
    let expected = format!("<td>test_mse</td><td>{}</td>", ((0.02 - 0.01 * 0.2 + 0.001) * 1e8_f64).round() / 1e8);
    assert!(section.contains(&expected), "{expected} not in {section}");
    assert!(section.contains("<td>eval.status</td><td>undefined (the string"), "{section}");
    render_in_chromium(&one, &p.path().join("one.png"), "1600,3000");

    let both = p.path().join("both.html");
    let out = p.run(&["report", &a, &b, "--out", both.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let html = std::fs::read_to_string(&both).unwrap();
    let section = html.split("<section id=\"series\">").nth(1).unwrap().split("</section>").next().unwrap();
    assert_eq!(section.matches("<figure>").count(), 6, "{section}");
    // The loss curve does not depend on SCALE: both runs' lines are drawn, A's and B's colour.
    assert_eq!(section.matches("stroke=\"#1565c0\"").count(), 6, "{section}");
    assert_eq!(section.matches("stroke=\"#c62828\"").count(), 6, "{section}");
    render_in_chromium(&both, &p.path().join("both.png"), "1600,3000");
}

/// `report` and `compare` read a pack's artifacts, someone else's files: one
/// that is a FIFO is refused at once, naming it, never waited on for a writer
/// (before, both commands hung on it). Both verify the pack first now, and a
/// FIFO where a packed file was fails that check: the pack is refused whole.
#[test]
fn a_fifo_among_a_packs_artifacts_is_refused_by_report_and_compare_not_waited_on() {
    let pack = std::path::PathBuf::from(format!("{}/artifacts/grpo-main-tiny/v0.2.0", env!("CARGO_MANIFEST_DIR")));
    for rel in ["outputs/results/table.json", "outputs/gates/gates.json", "outputs/eval@policy=sft/summary"] {
        let p = Project::new();
        let copy = p.path().join("pack");
        copy_tree(&pack, &copy);
        let fifo = copy.join(rel);
        std::fs::remove_file(&fifo).unwrap();
        common::mkfifo(&fifo);
        let html = p.path().join("r.html");
        let (copy, original) = (copy.to_str().unwrap(), pack.to_str().unwrap());
        let out = p.run_within(&["report", copy, "--out", html.to_str().unwrap()], 30);
        let said = format!("{}{}", stdout(&out), stderr(&out));
        assert_eq!(out.status.code(), Some(2), "{rel}: {said}");
        assert!(said.contains(rel) && said.contains("not a regular file"), "{rel}: {said}");
        assert!(!html.exists(), "{rel}: a report was written");
        let out = p.run_within(&["compare", copy, original], 30);
        let said = format!("{}{}", stdout(&out), stderr(&out));
        assert_eq!(out.status.code(), Some(2), "{rel}: {said}");
        assert!(said.contains(rel) && said.contains("not a regular file"), "{rel}: {said}");
    }
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Before, `report RUN`, `compare` and `export tensorboard` read a run's
/// outputs from the store as they found them: a metrics object damaged after
/// it was stored (`score` 0.7 → 0.99, bit rot or an edit after a chmod) was
/// drawn, compared and exported as the run's result. An output a reader
/// shows is now checked against its object's name first (up to 16 MiB; a
/// model folder is not read by them); a damaged one is not shown, and the
/// reader says why.
#[test]
fn a_damaged_object_of_a_run_is_never_shown_as_its_result() {
    let p = Project::new();
    p.write(
        "s.yaml",
        "name: s\nnodes:\n  measure:\n    op: shell\n    params: {cmd: \"echo '{\\\"score\\\": 0.7}' > m.json\", outs: [m.json], metrics: [m.json]}\n",
    );
    let events = p.run_json(&["s.yaml"], 0);
    let run = events[0]["run_id"].as_str().unwrap().to_string();
    let object = std::path::PathBuf::from(stdout(&p.run(&["path", "s.yaml", "measure:m.json"])).trim());
    common::damage_object(&object, "{\"score\": 0.99}\n");
    let html = p.path().join("r.html");
    let out = p.run(&["report", &run, "--out", html.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(!text.contains("0.99"), "the damaged value was reported");
    assert!(text.contains("damaged"), "the report does not say why m.json is not shown");
    let out = p.run(&["compare", &run, &run, "--all"]);
    let said = stdout(&out) + &stderr(&out);
    assert!(!said.contains("0.99") && said.contains("damaged"), "{said}");
}
