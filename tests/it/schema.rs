//! The checked-in spec schema (`schemas/experiment.schema.json`, which editors
//! load through the `yaml-language-server` line of every spec) is what
//! `orchestrate schema` generates from the ops' params types: a new param that
//! is not in it would be flagged by an editor as an error.

use crate::common;

use common::{stderr, Project};

#[test]
fn the_checked_in_schema_is_the_generated_one() {
    let p = Project::new();
    let out = p.run(&["schema", "--out", p.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let generated = std::fs::read_to_string(p.path().join("experiment.schema.json")).unwrap();
    let checked_in =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/experiment.schema.json")).unwrap();
    assert!(
        generated == checked_in,
        "schemas/experiment.schema.json is stale: run `orchestrate schema --out schemas` and commit it"
    );
}
