//! Command-line entry points (to be written).

/// Runs the command line.
pub fn main() -> std::process::ExitCode {
    std::process::ExitCode::SUCCESS
}
