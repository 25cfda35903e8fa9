//! `orchestrate`: the command line. The engine is the `orchestrate-core`
//! library (crates/core); numerical nodes run in the `orchestrate-torch`
//! worker (crates/torch), a separate process, so this binary never loads libtorch.

mod cli;

/// mimalloc, not glibc's malloc: the engine builds and frees many small
/// values (a spec's YAML tree, a DAG's nodes), and glibc's consolidation of
/// freed chunks was a quarter of a 10,000-node `plan` (`perf record`).
/// Built with `no_thp`: mimalloc then does not ask for transparent huge
/// pages (`madvise`), whose first touch zeroes 2 MiB, or stalls on
/// compaction, for a few KiB used; half of a no-op re-run's samples were
/// that zeroing, and a 10,000-node `plan` took 237 or 284 ms instead of 150
/// when it stalled. (The `MIMALLOC_ALLOW_THP=0` option instead calls
/// `prctl(PR_SET_THP_DISABLE)`, which every shell node and the libtorch
/// worker would inherit; the build flag touches this process alone.)
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
