//! `inferq submit` and `inferq cancel`: the Go producer's writes from the command line.
//! Submit reads every line first and submits nothing if any line is bad (unless told to skip
//! bad lines), then writes in pipelined batches with a progress bar on a terminal.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;

use anyhow::Context;

use super::input::{parse_line, LineError};
use super::{Failure, RedisArgs};
use crate::wire::NewRequest;

#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// JSONL input file; `-` or absent reads standard input.
    #[arg(long, short)]
    pub file: Option<PathBuf>,
    /// Timeout in seconds for lines that give neither `deadline` nor `timeout_s`.
    #[arg(long, default_value_t = 3600.0)]
    pub default_timeout_s: f64,
    /// Submit the good lines and report the bad ones, instead of submitting nothing.
    #[arg(long)]
    pub skip_invalid: bool,
    /// Requests per pipelined round trip.
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
}

#[derive(Debug, clap::Args)]
pub struct CancelArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Request ids to cancel (their newest generation).
    #[arg(required = true)]
    pub ids: Vec<String>,
}

fn read_input(args: &SubmitArgs) -> Result<(Vec<NewRequest>, Vec<LineError>), Failure> {
    let reader: Box<dyn BufRead> = match &args.file {
        Some(p) if p.as_os_str() != "-" => Box::new(std::io::BufReader::new(
            std::fs::File::open(p)
                .with_context(|| format!("cannot open {}", p.display()))
                .map_err(Failure::bad_input)?,
        )),
        _ => Box::new(std::io::stdin().lock()),
    };
    let now_s = crate::queue::producer::unix_ms() / 1000;
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.context("cannot read input")?;
        if line.trim().is_empty() {
            continue;
        }
        match parse_line(i + 1, &line, now_s, args.default_timeout_s) {
            Ok(r) => good.push(r),
            Err(e) => bad.push(e),
        }
    }
    Ok((good, bad))
}

pub async fn submit(args: SubmitArgs) -> Result<(), Failure> {
    let (requests, bad) = read_input(&args)?;
    for e in bad.iter().take(20) {
        eprintln!("inferq submit: {e}");
    }
    if bad.len() > 20 {
        eprintln!("inferq submit: … and {} more bad lines", bad.len() - 20);
    }
    if !bad.is_empty() && !args.skip_invalid {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "{} bad line(s); nothing was submitted (use --skip-invalid to submit the rest)",
            bad.len()
        )));
    }
    let producer = args.redis.producer().await?;
    let bar = progress(requests.len() as u64);
    let mut submitted = 0u64;
    let mut refused = 0u64;
    let mut pending = requests;
    while !pending.is_empty() {
        let rest = pending.split_off(pending.len().min(args.batch.max(1)));
        let chunk = std::mem::replace(&mut pending, rest);
        for outcome in producer.submit_many(chunk).await.context("submit failed")? {
            match outcome {
                Ok(_) => submitted += 1,
                Err(e) => {
                    refused += 1;
                    bar.suspend(|| eprintln!("inferq submit: {e}"));
                }
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    println!(
        "{}",
        serde_json::json!({"submitted": submitted, "refused": refused + bad.len() as u64, "queue": producer.request_queue()})
    );
    if refused > 0 {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "{refused} request(s) refused by the producer"
        )));
    }
    Ok(())
}

/// A progress bar on a terminal; hidden otherwise.
pub(crate) fn progress(len: u64) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} {msg} [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

pub async fn cancel(args: CancelArgs) -> Result<(), Failure> {
    let producer = args.redis.producer().await?;
    let marked = producer.cancel(&args.ids).await.context("cancel failed")?;
    for (id, marked) in args.ids.iter().zip(marked) {
        let state = if marked {
            "cancelled"
        } else {
            "no active generation"
        };
        println!("{}", serde_json::json!({"id": id, "result": state}));
    }
    Ok(())
}
