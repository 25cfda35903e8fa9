fn main() -> std::process::ExitCode {
    orchestrate::cli::main()
}
