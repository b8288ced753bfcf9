fn main() -> std::process::ExitCode {
    marketplace::cli::main()
}
