//! The libtorch-linked worker behind `orchestrate`: numerical nodes and
//! commands run here, in their own process (see `orchestrate::runtime`).

use std::process::ExitCode;

#[path = "../torch/mod.rs"]
mod torch;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["env", rest @ ..] => {
            let env = torch::env();
            if rest.contains(&"--json") {
                println!("{}", serde_json::to_string(&env).expect("env serializes"));
            } else {
                println!("libtorch {}\ndevice   {}", env.libtorch, env.device);
            }
            ExitCode::SUCCESS
        }
        ["--version"] => {
            println!("orchestrate-torch {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!(
                "usage: orchestrate-torch env [--json]\n(this worker is started by `orchestrate`; run that instead)"
            );
            ExitCode::from(2)
        }
    }
}
