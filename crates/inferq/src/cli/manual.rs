//! `inferq completions SHELL` and `inferq man --dir DIR`: shell completion scripts and man
//! pages made from the same clap definitions that parse the command line, so they never drift
//! from the flags. In: the parsed [`super::Cli`] definition. Out: a script on standard output,
//! or one roff page per command (`inferq.1`, `inferq-run.1`, …) written into a directory.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::CommandFactory as _;

use super::{Cli, Failure};

/// Print the completion script of a shell.
#[derive(Debug, clap::Args)]
pub(super) struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    pub shell: clap_complete::Shell,
}

/// Write the man pages.
#[derive(Debug, clap::Args)]
pub(super) struct ManArgs {
    /// The directory to write `inferq.1` and one page per subcommand into (made when missing).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
}

/// Writes `shell`'s completion script to standard output.
pub(super) fn completions(args: &CompletionsArgs) -> Result<(), Failure> {
    let mut command = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut command, "inferq", &mut out);
    use std::io::Write as _;
    std::io::stdout()
        .write_all(&out)
        .context("cannot write the completion script")?;
    Ok(())
}

/// Writes the man pages into `args.dir` (`inferq.1`, and `inferq-run.1`, `inferq-dead-letter-list.1`
/// … for every subcommand) and names each on standard output.
pub(super) fn man(args: &ManArgs) -> Result<(), Failure> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("--dir: cannot make {}", args.dir.display()))
        .map_err(Failure::bad_input)?;
    clap_mangen::generate_to(Cli::command(), &args.dir)
        .with_context(|| format!("cannot write the man pages into {}", args.dir.display()))?;
    let mut written: Vec<PathBuf> = std::fs::read_dir(&args.dir)
        .with_context(|| format!("cannot list {}", args.dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            name.starts_with("inferq") && name.ends_with(".1")
        })
        .collect();
    written.sort();
    for path in written {
        say!("{}", path.display());
    }
    Ok(())
}
