//! The `inferq` binary: a thin shell over [`inferq::cli`].

fn main() -> std::process::ExitCode {
    inferq::cli::main()
}
