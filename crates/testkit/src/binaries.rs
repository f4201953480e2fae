//! Finding the workspace's binaries from a tool or a test: `inferq-dev` (the demo, chaos
//! harness and benchmark) starts `inferq run` and `inferq submit`, and tests start either. Both
//! are built into one directory (`target/<profile>/`), so a binary is looked for next to the
//! running executable, then one directory up (a test runs from `target/<profile>/deps/`).
//! `$INFERQ_BIN` (for `inferq`) or `$INFERQ_DEV_BIN` (for `inferq-dev`) overrides the search.

use std::path::{Path, PathBuf};

/// A workspace binary that is not where it is looked for.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot find the {name} binary (looked in {looked}): build it with \
     `cargo build --release --workspace`, or set {env} to its path"
)]
pub struct MissingBinary {
    name: &'static str,
    env: &'static str,
    looked: String,
}

/// The production binary, `inferq`.
pub fn inferq_binary() -> Result<PathBuf, MissingBinary> {
    workspace_binary("inferq", "INFERQ_BIN")
}

/// The tools binary, `inferq-dev`.
pub fn dev_binary() -> Result<PathBuf, MissingBinary> {
    workspace_binary("inferq-dev", "INFERQ_DEV_BIN")
}

fn workspace_binary(name: &'static str, env: &'static str) -> Result<PathBuf, MissingBinary> {
    if let Some(path) = std::env::var_os(env) {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let dirs: Vec<&Path> = exe.ancestors().skip(1).take(2).collect();
    dirs.iter()
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .ok_or_else(|| MissingBinary {
            name,
            env,
            looked: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}
