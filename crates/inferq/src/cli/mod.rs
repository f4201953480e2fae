//! The `inferq` command line. `src/main.rs` calls [`main`]; each subcommand lives in its own
//! file and calls into the library. The tools (`demo`, `sim`, `chaos`, `bench`) are the
//! `inferq-dev` binary's, in the `inferq-dev` crate. Exit codes: 0 success, 2 bad input or configuration (the
//! message names the field or line), 1 anything else.

/// `println!` that does not panic when standard output is closed (a reader such as `head` went
/// away): the line is dropped, as the reader no longer wants it.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that does not panic when standard error is closed.
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod batch_api;
mod dead_letter;
mod input;
pub mod logs;
mod manual;
mod results;
mod run;
mod status;
pub mod submit;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for bad input or configuration.
pub const EXIT_BAD_INPUT: u8 = 2;

/// What `inferq --version` says: the release and the commit it was built from (`build.rs`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("INFERQ_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "inferq",
    version = VERSION,
    propagate_version = true,
    about = "Durable dispatch of latency-insensitive LLM requests from Redis to an inference gateway"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the processor (flags and config files as the Go llm-d-async processor).
    #[command(args_override_self = true)]
    Run(Box<crate::config::RunArgs>),
    /// Submit requests from JSONL (native lines or OpenAI Batch input lines).
    Submit(submit::SubmitArgs),
    /// Cancel the newest generation of request ids.
    Cancel(submit::CancelArgs),
    /// Write results as JSONL until N results or a timeout.
    Results(results::ResultsArgs),
    /// List, requeue or purge a queue's dead-lettered requests.
    DeadLetter(dead_letter::DeadLetterArgs),
    /// Count where a queue's requests are: pending, claimed, parked, dead, and those needing
    /// attention (overdue, leases run out, retries due, delivered again).
    Status(status::StatusArgs),
    /// Serve the OpenAI Files and Batches API: batch files in, results files out, over the
    /// queue of a processors' transport config.
    BatchApi(Box<batch_api::BatchApiArgs>),
    /// Print a shell's completion script (`source <(inferq completions bash)`).
    Completions(manual::CompletionsArgs),
    /// Write the man pages, one per command, into a directory.
    Man(manual::ManArgs),
}

/// Where Redis is and how to trust it, shared by the producer-side and dead-letter subcommands.
#[derive(Debug, Clone, clap::Args)]
pub struct RedisConn {
    /// Redis URL (redis://, rediss://, unix://; user and password allowed).
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379/")]
    pub redis_url: String,
    /// CA bundle (PEM) trusted for a rediss:// URL instead of the public roots.
    #[arg(long, env = "REDIS_TLS_CA_CERT", value_name = "PATH")]
    pub redis_tls_ca_cert: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for a Redis that requires one; needs --redis-tls-key.
    #[arg(
        long,
        env = "REDIS_TLS_CERT",
        value_name = "PATH",
        requires = "redis_tls_key"
    )]
    pub redis_tls_cert: Option<std::path::PathBuf>,
    /// Client key (PEM) for --redis-tls-cert.
    #[arg(
        long,
        env = "REDIS_TLS_KEY",
        value_name = "PATH",
        requires = "redis_tls_cert"
    )]
    pub redis_tls_key: Option<std::path::PathBuf>,
    /// How Redis is deployed, as the transport config's `mode`: standalone, cluster (the URL's
    /// host and --redis-addrs are seed nodes) or sentinel (they are sentinels).
    #[arg(
        long,
        env = "REDIS_MODE",
        value_name = "MODE",
        default_value = "standalone"
    )]
    pub redis_mode: String,
    /// More seed nodes or sentinels beside the URL's host, as `host:port` (comma-separated or
    /// repeated), as the transport config's `addrs`.
    #[arg(
        long,
        env = "REDIS_ADDRS",
        value_name = "HOST:PORT",
        value_delimiter = ','
    )]
    pub redis_addrs: Vec<String>,
    /// The name the sentinels monitor the primary under (sentinel mode only), as the transport
    /// config's `master_name`.
    #[arg(long, env = "REDIS_MASTER_NAME", value_name = "NAME")]
    pub redis_master_name: Option<String>,
}

impl RedisConn {
    /// The URL as `inferq run` reads it, and the TLS files for a `rediss://` one.
    pub fn url_and_tls(&self) -> Result<(String, inferq_client::connect::RedisTls), Failure> {
        let url = checked_redis_url(&self.redis_url)?;
        let tls = inferq_client::connect::RedisTls {
            ca_cert: self.redis_tls_ca_cert.clone(),
            client: self.redis_tls_cert.clone().zip(self.redis_tls_key.clone()),
        };
        Ok((url, tls))
    }

    /// Where these flags say Redis is; a bad URL, TLS file or mode combination is bad input
    /// that names the flag.
    pub fn target(&self) -> Result<inferq_client::target::Target, Failure> {
        let (url, tls) = self.url_and_tls()?;
        let topology =
            crate::config::topology::resolve_topology(&crate::config::topology::TopologyFields {
                mode: Some(&self.redis_mode),
                addrs: &self.redis_addrs,
                master_name: self.redis_master_name.as_deref(),
                url: &url,
                names: crate::config::topology::FLAG_FIELDS,
            })
            .map_err(Failure::bad_input)?;
        // The error names the URL or the TLS flag at fault.
        inferq_client::target::Target::new(&url, &tls, topology).map_err(Failure::bad_input)
    }

    /// A connection to this Redis for the operator's commands (`dead-letter`, `status`); a bad
    /// URL, TLS file or mode is bad input.
    pub async fn connect(&self) -> Result<inferq_client::target::Link, Failure> {
        use anyhow::Context;
        let target = self.target()?;
        Ok(target.connect().await.context("cannot connect to Redis")?)
    }
}

/// Where the producer-side commands find Redis and the queues.
#[derive(Debug, clap::Args)]
pub struct RedisArgs {
    #[command(flatten)]
    pub conn: RedisConn,
    /// The request sorted set.
    #[arg(long, default_value = "request-sortedset")]
    pub queue: String,
    /// The result list.
    #[arg(long, default_value = "result-list")]
    pub result_queue: String,
}

impl RedisArgs {
    /// A producer on these queues.
    pub async fn producer(&self) -> Result<inferq_client::producer::Producer, Failure> {
        use anyhow::Context;
        let target = self.conn.target()?;
        Ok(inferq_client::producer::Producer::connect_target(
            &target,
            &self.queue,
            &self.result_queue,
        )
        .await
        .context("cannot connect to Redis")?)
    }
}

/// `--redis-url` read as `inferq run` reads its `url` (go-redis's `?db=N` and options), so a
/// producer-side command reaches the database the processor serves; a bad URL is bad input.
pub fn checked_redis_url(url: &str) -> Result<String, Failure> {
    let mut warnings = Vec::new();
    let url = crate::config::check_redis_url(url, "--redis-url", &mut warnings)
        .map_err(|reason| Failure::bad_input(anyhow::anyhow!("--redis-url: {reason}")))?;
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    Ok(url)
}

/// A failure with its exit code.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub error: anyhow::Error,
}

impl Failure {
    pub fn bad_input(error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            code: EXIT_BAD_INPUT,
            error: error.into(),
        }
    }
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure {
            code: 1,
            error: e.into(),
        }
    }
}

/// Tokio's own setting for its worker threads (default: one per core). Tokio would panic on a
/// value it cannot use; inferq reads it first and refuses such a value as bad input.
const WORKER_THREADS_ENV: &str = "TOKIO_WORKER_THREADS";

/// The worker thread count `TOKIO_WORKER_THREADS` asks for: `None` when unset.
fn worker_threads(value: Option<std::ffi::OsString>) -> Result<Option<usize>, String> {
    let Some(value) = value else {
        return Ok(None);
    };
    let text = value.to_string_lossy();
    match text.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(Some(n)),
        _ => Err(format!(
            "must be a whole number of threads, at least 1 (got {text:?})"
        )),
    }
}

/// Parses the command line and runs the subcommand.
/// For an argument clap did not expect right after a `--flag` without `=`: how to give it as
/// that flag's value. A boolean flag takes its value only after `=` (`--zap-devel=false`), as
/// Go's flags do, and a value that starts with `-` (`--drain-timeout=-1s`) needs it too.
fn value_hint(e: &clap::Error, argv: &[String]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(bad)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    // The word clap names (`-1` of `-1s`) right after a `--flag` without `=`.
    let at = (1..argv.len()).find(|&i| {
        argv[i].starts_with(bad.as_str())
            && argv[i - 1].starts_with("--")
            && !argv[i - 1].contains('=')
    })?;
    let flag = &argv[at - 1];
    let value = argv.get(at).filter(|v| !v.starts_with("--"))?;
    Some(format!(
        "  tip: to give {flag} the value {value:?}, write {flag}={value}"
    ))
}

/// The log level and format a command asks for: Go's `-v` (2 is the default, 3 verbose, 4
/// debug, 5 trace; `RUST_LOG` overrides) and zap's flags, for `run`; info as text otherwise.
fn log_settings(command: &Command) -> (&'static str, logs::LogFormat) {
    match command {
        Command::Run(args) => {
            let level = match args.v {
                v if v >= 5 => "trace",
                4 => "debug",
                v if v <= 0 => "warn",
                _ => "info",
            };
            let format = logs::LogFormat::from_zap_flags(
                args.zap_devel,
                args.zap_encoder.as_deref(),
                args.zap_time_encoding.as_deref(),
            );
            (level, format)
        }
        _ => ("info", logs::LogFormat::Text),
    }
}

pub fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_BAD_INPUT } else { 0 };
            let _ = e.print();
            let words: Vec<String> = argv
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            if let Some(hint) = value_hint(&e, &words) {
                tell!("{hint}");
            }
            return ExitCode::from(code);
        }
    };
    let (level, format) = log_settings(&cli.command);
    logs::init(level, format);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    match worker_threads(std::env::var_os(WORKER_THREADS_ENV)) {
        Ok(Some(n)) => {
            builder.worker_threads(n);
        }
        Ok(None) => {}
        Err(reason) => {
            logs::fatal(format, &format!("{WORKER_THREADS_ENV}: {reason}"));
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            logs::fatal(format, &format!("cannot start the async runtime: {e}"));
            return ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(*args).await,
            Command::Submit(args) => submit::submit(args).await,
            Command::Cancel(args) => submit::cancel(args).await,
            Command::Results(args) => results::results(args).await,
            Command::DeadLetter(args) => dead_letter::dead_letter(args).await,
            Command::Status(args) => status::status(args).await,
            Command::BatchApi(args) => batch_api::batch_api(*args).await,
            Command::Completions(args) => manual::completions(&args),
            Command::Man(args) => manual::man(&args),
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            // Each cause once: many errors show their source in their own text as well.
            logs::fatal(format, &crate::gateway::error_chain(f.error.as_ref()));
            ExitCode::from(f.code)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::{value_hint, Cli};

    fn hint(args: &[&str]) -> Option<String> {
        let argv: Vec<String> = std::iter::once("inferq")
            .chain(args.iter().copied())
            .map(str::to_owned)
            .collect();
        match Cli::try_parse_from(&argv) {
            Ok(_) => None,
            Err(e) => value_hint(&e, &argv),
        }
    }

    /// A boolean's value or a negative value given as a separate word is refused by clap with
    /// "unexpected argument"; the tip says how to write it.
    #[test]
    fn a_value_given_as_a_separate_word_gets_a_tip() {
        assert_eq!(
            hint(&["run", "--metrics-endpoint-auth", "false"]).as_deref(),
            Some("  tip: to give --metrics-endpoint-auth the value \"false\", write --metrics-endpoint-auth=false")
        );
        assert_eq!(
            hint(&["run", "--drain-timeout", "-1s"]).as_deref(),
            Some("  tip: to give --drain-timeout the value \"-1s\", write --drain-timeout=-1s")
        );
        assert_eq!(hint(&["run", "--no-such-flag"]), None);
        assert_eq!(hint(&["run", "--zap-devel", "--no-such-flag"]), None);
        assert_eq!(hint(&["run", "--metrics-endpoint-auth=false"]), None);
    }
}

#[cfg(test)]
mod status_args {
    use clap::Parser as _;

    use super::Cli;

    /// `inferq status --watch 1s --samples 0` asks for no count at all: it is bad input (exit
    /// 2), where it used to count once and exit 0 as if `--samples 1` had been given.
    #[test]
    fn zero_samples_is_refused() {
        let parse = |samples: &str| {
            Cli::try_parse_from(["inferq", "status", "--watch", "1s", "--samples", samples])
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert_eq!(parse("1"), Ok(()));
        let refused = parse("0").unwrap_err();
        assert!(refused.contains("--samples"), "{refused}");
    }
}
