//! Names the commit `inferq --version` reports: `INFERQ_COMMIT` when set (an image build from a
//! source tree without `.git`), else `git rev-parse --short=12 HEAD`, else `unknown`. Out: the
//! `INFERQ_COMMIT` compile-time variable. Uncommitted changes are not flagged: cargo would not
//! run this script again for an edit to another crate, so such a flag could be stale.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=INFERQ_COMMIT");
    let commit = match std::env::var("INFERQ_COMMIT") {
        Ok(given) if !given.trim().is_empty() => given.trim().to_owned(),
        _ => from_git(),
    };
    println!("cargo:rustc-env=INFERQ_COMMIT={commit}");
}

/// The work tree's commit; the build runs again when HEAD moves (a commit, a checkout).
fn from_git() -> String {
    let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) else {
        return "unknown".to_owned();
    };
    let git_dir = Path::new(&git_dir);
    for watched in ["HEAD", "packed-refs"] {
        let path = git_dir.join(watched);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
        let path = git_dir.join(head_ref);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
}
