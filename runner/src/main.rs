//! The `knotless-run` binary: parses flags and hands over to the library.

fn main() -> std::process::ExitCode {
    knotless_run::cli::main()
}
