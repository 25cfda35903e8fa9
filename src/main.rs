//! `orchestrate`: the command line. The engine is the `orchestrate-core`
//! library (crates/core); numerical nodes run in the `orchestrate-torch`
//! worker (crates/torch), a separate process, so this binary never loads libtorch.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
