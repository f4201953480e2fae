//! `inferq submit` and `inferq cancel`: the Go producer's writes from the command line.
//! Submit reads every line first and submits nothing if any line is bad (unless told to skip
//! bad lines), then writes in pipelined batches with a progress bar on a terminal.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;

use anyhow::Context;

use super::input::{parse_line, LineError};
use super::{Failure, RedisArgs};
use crate::queue::producer::ProducerError;
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
// A cancel marker is per id, whatever the queue: neither queue is asked for.
#[command(mut_arg("queue", |a| a.hide(true)), mut_arg("result_queue", |a| a.hide(true)))]
pub struct CancelArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Request ids to cancel (their newest generation).
    #[arg(required = true)]
    pub ids: Vec<String>,
}

/// Reads every line, then parses them all against one clock reading taken once the input has
/// ended (a `timeout_s` counts from submission, however slowly the lines arrived). A line that
/// is not UTF-8 is a bad line like any other. The requests keep their line numbers.
/// The requests with their line numbers, and the bad lines.
type Input = (Vec<(usize, NewRequest)>, Vec<LineError>);

fn read_input(args: &SubmitArgs) -> Result<Input, Failure> {
    let mut reader: Box<dyn BufRead> = match &args.file {
        // A directory opens, then fails at the first read: refuse it as the bad input it is.
        Some(p) if p.is_dir() => {
            return Err(Failure::bad_input(anyhow::anyhow!(
                "--file {}: is a directory, not a JSONL file",
                p.display()
            )))
        }
        Some(p) if p.as_os_str() != "-" => Box::new(std::io::BufReader::new(
            std::fs::File::open(p)
                .with_context(|| format!("cannot open {}", p.display()))
                .map_err(Failure::bad_input)?,
        )),
        _ => Box::new(std::io::stdin().lock()),
    };
    let mut lines = Vec::new();
    let mut bad = Vec::new();
    let mut buf = Vec::new();
    for line_no in 1.. {
        buf.clear();
        if reader
            .read_until(b'\n', &mut buf)
            .context("cannot read input")?
            == 0
        {
            break;
        }
        match std::str::from_utf8(&buf) {
            Ok(text) if text.trim().is_empty() => {}
            Ok(text) => lines.push((line_no, text.trim_end_matches(['\n', '\r']).to_owned())),
            Err(e) => bad.push(LineError {
                line: line_no,
                reason: format!("not valid UTF-8 ({e})"),
            }),
        }
    }
    let now_s = crate::queue::producer::unix_ms() / 1000;
    let mut good = Vec::with_capacity(lines.len());
    for (line_no, text) in lines {
        match parse_line(line_no, &text, now_s, args.default_timeout_s) {
            Ok(r) => good.push((line_no, r)),
            Err(e) => bad.push(e),
        }
    }
    bad.sort_by_key(|e| e.line);
    Ok((good, bad))
}

pub async fn submit(args: SubmitArgs) -> Result<(), Failure> {
    let (requests, bad) = read_input(&args)?;
    for e in bad.iter().take(20) {
        tell!("inferq submit: {e}");
    }
    if bad.len() > 20 {
        tell!("inferq submit: … and {} more bad lines", bad.len() - 20);
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
    // The first request Redis refused (its line, and why).
    let mut redis_refused: Option<(usize, String)> = None;
    // Taken a batch at a time from the front (splitting the rest off a Vec copied all that was
    // left at every batch: a million lines took two minutes instead of about twenty seconds).
    let mut pending = requests.into_iter().peekable();
    while pending.peek().is_some() {
        let chunk: Vec<_> = pending.by_ref().take(args.batch.max(1)).collect();
        let lines: Vec<usize> = chunk.iter().map(|(line, _)| *line).collect();
        let sent = producer
            .submit_many(chunk.into_iter().map(|(_, r)| r).collect())
            .await;
        let outcomes = match sent {
            Ok(outcomes) => outcomes,
            Err(e) => {
                // The batch's replies are unknown: say exactly what is queued, what may be,
                // and what was never sent, so a rerun can start at the right line.
                bar.finish_and_clear();
                let (first, last) = (lines.first().copied(), lines.last().copied());
                let not_sent = pending.peek().map(|(line, _)| *line);
                say!(
                    "{}",
                    serde_json::json!({"submitted": submitted, "refused": refused + bad.len() as u64, "queue": producer.request_queue(), "in_doubt_lines": [first, last], "not_sent_from_line": not_sent})
                );
                let mut what = format!(
                    "lines {} to {} may or may not be queued (Redis did not confirm them)",
                    first.unwrap_or(0),
                    last.unwrap_or(0)
                );
                if let Some(line) = not_sent {
                    what.push_str(&format!("; lines from {line} on were not sent"));
                }
                return Err(Failure::from(anyhow::anyhow!(
                    "submit failed after {submitted} request(s): {e}; {what}"
                )));
            }
        };
        for (outcome, line) in outcomes.into_iter().zip(lines) {
            match outcome {
                Ok(_) => submitted += 1,
                Err(e) => {
                    refused += 1;
                    if let ProducerError::Redis(e) = &e {
                        // Redis refused the request (OOM at maxmemory, NOPERM, WRONGTYPE): not queued.
                        redis_refused.get_or_insert_with(|| (line, e.to_string()));
                    }
                    bar.suspend(|| tell!("inferq submit: line {line}: {e}"));
                }
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    say!(
        "{}",
        serde_json::json!({"submitted": submitted, "refused": refused + bad.len() as u64, "queue": producer.request_queue()})
    );
    if let Some((line, e)) = redis_refused {
        return Err(Failure::from(anyhow::anyhow!(
            "Redis refused request(s), the first at line {line}: {e}; refused lines were not queued \
             (submit them again once Redis takes them)"
        )));
    }
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
        say!("{}", serde_json::json!({"id": id, "result": state}));
    }
    Ok(())
}
