//! The report's layered DAG on the committed pack (an integration test: the
//! pack module reads packs for the report, so the report's own tests may not
//! reach back into it; tests/layers.rs forbids the cycle).

use orchestrate_core::report::{layered, listed};

#[test]
fn the_committed_packs_dag_is_drawn_in_ranks_with_fewer_crossings_than_listed() {
    let pack = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../artifacts/grpo-main-tiny/v0.2.0");
    let src = orchestrate_core::pack::report_source(&pack).unwrap();
    let (l, naive) = (layered(&src.nodes), listed(&src.nodes));
    assert!(l.chains.iter().all(|c| c.windows(2).all(|w| l.rank[w[0]] + 1 == l.rank[w[1]])));
    assert!(l.crossings() < naive.crossings(), "{} vs {}", l.crossings(), naive.crossings());
    // More than one rank: not every node in one row.
    assert!(l.layers.len() >= 6, "{:?}", l.layers);
    eprintln!("crossings: listed {}, layered {}", naive.crossings(), l.crossings());
}
