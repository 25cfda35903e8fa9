//! The guard's nonce registry across processes.

use crate::common;

use common::Project;

#[test]
fn thirty_two_processes_race_for_one_nonce_and_exactly_one_wins() {
    let p = Project::new();
    let ws = orchestrate_core::store::Workspace::open(&p.path().join(".orchestrate")).unwrap();
    orchestrate_core::guard::Ledger::open(&ws).unwrap().register_nonce("n-1", "batch", "policy").unwrap();
    let children: Vec<_> = (0..32)
        .map(|_| p.cmd(&["guard", "spend-nonce", "n-1"]).stdout(std::process::Stdio::piped()).spawn().unwrap())
        .collect();
    let outputs: Vec<String> = children
        .into_iter()
        .map(|c| String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout).trim().to_string())
        .collect();
    assert_eq!(outputs.iter().filter(|o| *o == "won").count(), 1, "{outputs:?}");
    assert_eq!(outputs.iter().filter(|o| *o == "lost").count(), 31, "{outputs:?}");
}

#[test]
fn the_codes_table_lists_every_code_with_its_decision() {
    let p = Project::new();
    let text = common::stdout(&p.run(&["guard", "codes"]));
    for code in orchestrate_core::guard::Code::ALL {
        assert!(text.contains(&format!("`{}`", code.id())), "{}", code.id());
    }
    assert!(text.contains("| `R006_EVALUATOR_ALIAS` | reward | Quarantine |"), "{text}");
}
