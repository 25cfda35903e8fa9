//! `orchestrate`: the command line. The engine is the `orchestrate-core`
//! library (crates/core); numerical nodes run in the `orchestrate-torch`
//! worker (crates/torch), a separate process, so this binary never loads libtorch.

mod cli;

/// mimalloc, not glibc's malloc: the engine builds and frees many small
/// values (a spec's YAML tree, a DAG's nodes), and glibc's consolidation of
/// freed chunks was a quarter of a 10,000-node `plan` (`perf record`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
