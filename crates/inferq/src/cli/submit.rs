//! `inferq submit` and `inferq cancel`: the Go producer's writes from the command line.
//! Submit checks every line first and submits nothing if any line is bad (unless told to skip
//! bad lines), then writes in pipelined batches with a progress bar on a terminal. The input is
//! read twice (checked, then streamed), so memory does not grow with its length: a file where
//! it lies, standard input from an unnamed temporary file it is first copied to.
//! SIGINT or SIGTERM stops it between two batches, and its summary names the first line not
//! sent (a second signal exits at once).

use std::collections::HashSet;
use std::io::{BufRead, IsTerminal, Read, Seek, Write};
use std::path::PathBuf;

use anyhow::Context;

use tokio_util::sync::CancellationToken;

use super::input::{parse_line, LineError};
use super::{Failure, RedisArgs};
use inferq_client::producer::{PayloadKeys, ProducerError};
use inferq_client::wire::NewRequest;

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
    /// Requests per pipelined round trip (fewer when their payloads pass 4 MiB).
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    /// Report a request submitted only once this many replicas hold it (Redis `WAIT`), so a
    /// fail-over cannot lose it; 0 waits for none. Those that reach fewer in time are refused
    /// with the reason (they are queued on the primary, but may be lost).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub replica_wait: i64,
    /// How long --replica-wait waits for the replicas, in milliseconds [default: 1000].
    #[arg(long, value_name = "MS")]
    pub replica_wait_timeout_ms: Option<i64>,
    /// Store every request body apart from its member, at `request-payload:<id>:<token>`
    /// (newer Go's payload keys). Only once every processor reads them: an older Go processor
    /// sends a null body.
    #[arg(long, conflicts_with = "payload_keys_above")]
    pub payload_keys: bool,
    /// Store bodies of more than this many bytes apart (see --payload-keys), the others inline.
    #[arg(long, value_name = "BYTES")]
    pub payload_keys_above: Option<usize>,
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

/// Reads the input's lines, skipping blank ones; a line that is not UTF-8 is a bad line like
/// any other.
struct LineReader {
    reader: Box<dyn BufRead>,
    line_no: usize,
    buf: Vec<u8>,
}

impl LineReader {
    fn new(reader: Box<dyn BufRead>) -> LineReader {
        LineReader {
            reader,
            line_no: 0,
            buf: Vec::new(),
        }
    }

    /// The next non-blank line, with its number; `None` at the end.
    fn next_line(&mut self) -> std::io::Result<Option<(usize, Result<&str, LineError>)>> {
        loop {
            self.buf.clear();
            if self.reader.read_until(b'\n', &mut self.buf)? == 0 {
                return Ok(None);
            }
            self.line_no += 1;
            if !matches!(std::str::from_utf8(&self.buf), Ok(text) if text.trim().is_empty()) {
                break;
            }
        }
        let line = self.line_no;
        Ok(Some(match std::str::from_utf8(&self.buf) {
            Ok(text) => (line, Ok(text.trim_end_matches(['\n', '\r']))),
            Err(e) => (
                line,
                Err(LineError {
                    line,
                    reason: format!("not valid UTF-8 ({e})"),
                }),
            ),
        }))
    }
}

/// The requests to submit, in line order: the input, checked whole first, then read again and
/// parsed as it is submitted, so memory does not grow with its length. The lines the check
/// found bad are passed over.
struct Requests {
    lines: LineReader,
    bad: HashSet<usize>,
    now_s: i64,
    default_timeout_s: f64,
}

/// One step through [`Requests`].
enum Next {
    Request(usize, NewRequest),
    /// A line that was good when checked and is not now (the file changed meanwhile).
    Bad(LineError),
    /// The file could not be read on from this line.
    Unreadable(usize, std::io::Error),
    End,
}

impl Next {
    /// The input line this step is about (`None` at the end): where a stopped submission goes
    /// on from.
    fn line(&self) -> Option<usize> {
        match self {
            Next::Request(line, _) | Next::Unreadable(line, _) => Some(*line),
            Next::Bad(e) => Some(e.line),
            Next::End => None,
        }
    }
}

impl Requests {
    fn next(&mut self) -> Next {
        let line = self.lines.line_no + 1;
        self.read_on().unwrap_or_else(|e| Next::Unreadable(line, e))
    }

    fn read_on(&mut self) -> std::io::Result<Next> {
        loop {
            let Some((line_no, text)) = self.lines.next_line()? else {
                return Ok(Next::End);
            };
            if self.bad.contains(&line_no) {
                continue;
            }
            return Ok(
                match text.and_then(|t| parse_line(line_no, t, self.now_s, self.default_timeout_s))
                {
                    Ok(r) => Next::Request(line_no, r),
                    Err(e) => Next::Bad(e),
                },
            );
        }
    }
}

/// Where the input's lines are read from, once to check them and once to submit them.
enum Source {
    /// A file given with `--file`, opened afresh for each read.
    Path(PathBuf),
    /// Standard input, copied to an unnamed temporary file (deleted when closed) before the
    /// first read, since it cannot be read twice. Each read rewinds it.
    Spool(std::fs::File),
}

impl Source {
    /// Copies standard input to an unnamed file in the temporary directory (`TMPDIR`).
    fn spool_stdin() -> Result<Source, Failure> {
        let dir = std::env::temp_dir();
        let cannot_write = |e: std::io::Error| {
            Failure::from(anyhow::anyhow!(
                "cannot copy standard input to a temporary file in {} ({e}); nothing was \
                 submitted (set TMPDIR to a directory with room, or give the input with --file)",
                dir.display()
            ))
        };
        let mut spool = tempfile::tempfile_in(&dir).map_err(cannot_write)?;
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0; 64 << 10];
        loop {
            let n = match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Failure::from(anyhow::anyhow!("cannot read input: {e}"))),
            };
            spool.write_all(&buf[..n]).map_err(cannot_write)?;
        }
        Ok(Source::Spool(spool))
    }

    /// A reader from the input's first line.
    fn open(&self) -> Result<LineReader, Failure> {
        let file = match self {
            Source::Path(p) => std::fs::File::open(p)
                .with_context(|| format!("cannot open {}", p.display()))
                .map_err(Failure::bad_input)?,
            Source::Spool(spool) => {
                // The clone shares the spool's offset: the reads are one after the other.
                let mut f = spool
                    .try_clone()
                    .context("cannot read standard input back from its temporary file")?;
                f.rewind()
                    .context("cannot read standard input back from its temporary file")?;
                f
            }
        };
        Ok(LineReader::new(Box::new(std::io::BufReader::new(file))))
    }
}

/// The requests with how many there are, and the bad lines (by line number).
type Input = (Requests, usize, Vec<LineError>);

/// Checks every line, parsing them all against one clock reading, taken once standard input
/// has ended (a `timeout_s` counts from submission, however slowly the lines arrived) or
/// before a file is read. The same reading serves both reads of the input.
fn read_input(args: &SubmitArgs) -> Result<Input, Failure> {
    let source = match &args.file {
        // A directory opens, then fails at the first read: refuse it as the bad input it is.
        Some(p) if p.is_dir() => {
            return Err(Failure::bad_input(anyhow::anyhow!(
                "--file {}: is a directory, not a JSONL file",
                p.display()
            )))
        }
        Some(p) if p.as_os_str() != "-" => Source::Path(p.clone()),
        _ => Source::spool_stdin()?,
    };
    let now_s = inferq_client::producer::unix_ms() / 1000;
    let mut bad = Vec::new();
    let mut good = 0;
    let mut lines = source.open()?;
    while let Some((line_no, text)) = lines.next_line().context("cannot read input")? {
        match text.and_then(|t| parse_line(line_no, t, now_s, args.default_timeout_s)) {
            Ok(_) => good += 1,
            Err(e) => bad.push(e),
        }
    }
    drop(lines);
    let requests = Requests {
        lines: source.open()?,
        bad: bad.iter().map(|e| e.line).collect(),
        now_s,
        default_timeout_s: args.default_timeout_s,
    };
    Ok((requests, good, bad))
}

/// The most payload bytes one pipelined batch carries, whatever `--batch` says: the batch is
/// held in memory (several copies while it is encoded) and Redis reads it in one go, so 500
/// lines of 100 KB held 160 MB, and 500 lines near the 16 MiB member limit would hold
/// gigabytes.
const BATCH_BYTES: usize = 4 << 20;

pub async fn submit(args: SubmitArgs) -> Result<(), Failure> {
    let (mut requests, count, bad) = read_input(&args)?;
    refuse_bad_lines(&bad, args.skip_invalid)?;
    let producer = producer_for(&args).await?;
    // SIGINT or SIGTERM stops it between two batches, with the summary saying where.
    let stop = CancellationToken::new();
    tokio::spawn(super::results::watch_signals(stop.clone()));
    let mut run = Run {
        bar: progress(count as u64),
        queue: producer.request_queue().to_owned(),
        submitted: 0,
        refused: 0,
        bad_lines: bad.len() as u64,
        redis_refused: None,
    };
    // A batch at a time, with the step after it looked at already: where a failed batch
    // leaves the rest of the input.
    let mut ahead = requests.next();
    while !matches!(ahead, Next::End | Next::Unreadable(..)) {
        if stop.is_cancelled() {
            return Err(run.stopped(ahead.line()));
        }
        let chunk = run.next_batch(&mut ahead, &mut requests, args.batch);
        if chunk.is_empty() {
            continue;
        }
        let lines: Vec<usize> = chunk.iter().map(|(line, _)| *line).collect();
        let sent = producer
            .submit_many(chunk.into_iter().map(|(_, r)| r).collect())
            .await;
        match sent {
            Ok(outcomes) => run.count(outcomes, lines),
            Err(e) => return Err(run.batch_failed(&e, &lines, ahead.line())),
        }
    }
    run.finish(ahead)
}

/// Prints up to 20 of the lines the check found bad; refuses them all unless `--skip-invalid`.
fn refuse_bad_lines(bad: &[LineError], skip_invalid: bool) -> Result<(), Failure> {
    for e in bad.iter().take(20) {
        tell!("inferq submit: {e}");
    }
    if bad.len() > 20 {
        tell!("inferq submit: … and {} more bad lines", bad.len() - 20);
    }
    if !bad.is_empty() && !skip_invalid {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "{} bad line(s); nothing was submitted (use --skip-invalid to submit the rest)",
            bad.len()
        )));
    }
    Ok(())
}

/// The producer the flags ask for: its Redis, replica wait and payload keys.
async fn producer_for(args: &SubmitArgs) -> Result<inferq_client::producer::Producer, Failure> {
    let wait = crate::config::claim::resolve_replica_wait(
        Some(args.replica_wait),
        args.replica_wait_timeout_ms,
        ("--replica-wait", "--replica-wait-timeout-ms"),
    )
    .map_err(Failure::bad_input)?;
    let apart = match (args.payload_keys, args.payload_keys_above) {
        (true, _) => PayloadKeys::Always,
        (false, Some(n)) => PayloadKeys::Above(n),
        (false, None) => PayloadKeys::Inline,
    };
    Ok(args
        .redis
        .producer()
        .await?
        .with_replica_wait(wait)
        .with_payload_keys(apart))
}

/// Where a submission stands: what was queued, what was refused while submitting, how many
/// lines the check found bad (passed over with `--skip-invalid`), the first request Redis
/// itself refused (its line, and why), and the progress bar.
struct Run {
    bar: indicatif::ProgressBar,
    queue: String,
    submitted: u64,
    refused: u64,
    bad_lines: u64,
    redis_refused: Option<(usize, String)>,
}

impl Run {
    /// The summary line on standard output, with `more` fields (where the input stopped).
    fn summary(&self, more: serde_json::Value) {
        let mut line = serde_json::json!({
            "submitted": self.submitted,
            "refused": self.refused + self.bad_lines,
            "queue": self.queue,
        });
        if let (Some(line), serde_json::Value::Object(more)) = (line.as_object_mut(), more) {
            line.extend(more);
        }
        say!("{line}");
    }

    /// The next batch: up to `batch` requests and [`BATCH_BYTES`] of payload, passing over (and
    /// counting) lines that turned bad since the check.
    fn next_batch(
        &mut self,
        ahead: &mut Next,
        requests: &mut Requests,
        batch: usize,
    ) -> Vec<(usize, NewRequest)> {
        let mut chunk = Vec::new();
        let mut bytes = 0usize;
        while chunk.len() < batch.max(1)
            && bytes < BATCH_BYTES
            && !matches!(ahead, Next::End | Next::Unreadable(..))
        {
            match std::mem::replace(ahead, requests.next()) {
                Next::Request(line, r) => {
                    bytes += r.payload.get().len() + r.id.len();
                    chunk.push((line, r))
                }
                Next::Bad(e) => {
                    self.refused += 1;
                    self.bar.suspend(|| {
                        tell!("inferq submit: {e} (the file changed since it was checked)")
                    });
                }
                // Not reached: the loop stops at them.
                Next::End | Next::Unreadable(..) => {}
            }
        }
        chunk
    }

    /// Counts a batch's answers, one per line.
    fn count(
        &mut self,
        outcomes: Vec<Result<inferq_client::producer::Submitted, ProducerError>>,
        lines: Vec<usize>,
    ) {
        for (outcome, line) in outcomes.into_iter().zip(lines) {
            match outcome {
                Ok(_) => self.submitted += 1,
                Err(e) => {
                    self.refused += 1;
                    if let ProducerError::Redis(e) = &e {
                        // Redis refused the request (OOM at maxmemory, NOPERM, WRONGTYPE): not queued.
                        self.redis_refused
                            .get_or_insert_with(|| (line, e.to_string()));
                    }
                    self.bar
                        .suspend(|| tell!("inferq submit: line {line}: {e}"));
                }
            }
            self.bar.inc(1);
        }
    }

    /// Stopped by a signal between two batches: where the input stopped.
    fn stopped(self, not_sent: Option<usize>) -> Failure {
        self.bar.finish_and_clear();
        self.summary(serde_json::json!({"not_sent_from_line": not_sent}));
        tell!(
            "inferq submit: stopped by a signal after {} request(s); lines from {} on were not sent",
            self.submitted,
            not_sent.unwrap_or(0)
        );
        Failure {
            code: 1,
            error: anyhow::anyhow!("stopped by a signal"),
        }
    }

    /// A batch whose replies are unknown: says exactly what is queued, what may be, and what
    /// was never sent, so a rerun can start at the right line.
    fn batch_failed(self, e: &ProducerError, lines: &[usize], not_sent: Option<usize>) -> Failure {
        self.bar.finish_and_clear();
        let (first, last) = (lines.first().copied(), lines.last().copied());
        self.summary(
            serde_json::json!({"in_doubt_lines": [first, last], "not_sent_from_line": not_sent}),
        );
        let mut what = format!(
            "lines {} to {} may or may not be queued (Redis did not confirm them)",
            first.unwrap_or(0),
            last.unwrap_or(0)
        );
        if let Some(line) = not_sent {
            what.push_str(&format!("; lines from {line} on were not sent"));
        }
        Failure::from(anyhow::anyhow!(
            "submit failed after {} request(s): {e}; {what}",
            self.submitted
        ))
    }

    /// The end of the input (or of what could be read): the summary, and the exit it calls for.
    fn finish(self, ahead: Next) -> Result<(), Failure> {
        self.bar.finish_and_clear();
        if let Next::Unreadable(line, e) = ahead {
            self.summary(serde_json::json!({"not_sent_from_line": line}));
            return Err(Failure::from(anyhow::anyhow!(
                "cannot read the input on from line {line} ({e}) after {} request(s) were \
                 submitted; lines from {line} on were not sent",
                self.submitted
            )));
        }
        self.summary(serde_json::json!({}));
        if let Some((line, e)) = self.redis_refused {
            return Err(Failure::from(anyhow::anyhow!(
                "Redis refused request(s), the first at line {line}: {e}; refused lines were not queued \
                 (submit them again once Redis takes them)"
            )));
        }
        if self.refused > 0 {
            return Err(Failure::bad_input(anyhow::anyhow!(
                "{} request(s) refused by the producer",
                self.refused
            )));
        }
        Ok(())
    }
}

/// A progress bar on a terminal; hidden otherwise.
pub fn progress(len: u64) -> indicatif::ProgressBar {
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
