//! What the simulator counts. Request handlers bump the lock-free counters in [`Stats`] as
//! requests move through admission and the run stage; the counts leave as a [`SimStats`]
//! snapshot (`GET /stats`, [`super::Sim::stats`]) and as Prometheus text (`GET /metrics`).
//! Per-id executions are kept once, as arrival times (`arrivals`), and counted from them.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use serde::Serialize;

/// Monotonic counters and live gauges, all atomics so the hot path never locks.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// TCP connections accepted, bumped by the accept loop (which holds a clone of the `Arc`);
    /// with TLS, counted before the handshake, so failed handshakes count too.
    pub connections_accepted: Arc<AtomicU64>,
    /// Every request that reached a completion endpoint.
    pub requests: AtomicU64,
    /// Requests admitted to the run stage (the sum of all per-id executions, plus requests
    /// that carried no id).
    pub executed: AtomicU64,
    /// 200 answers.
    pub ok: AtomicU64,
    /// Of `ok`, answers that stopped at the requested `max_tokens`.
    pub ok_length: AtomicU64,
    /// 400 answers: malformed bodies and the bad-request fault.
    pub bad_request: AtomicU64,
    /// 429 answers of any cause.
    pub too_many_requests: AtomicU64,
    /// Of `too_many_requests`, the ones refused because capacity and queue were full.
    pub rejected_capacity: AtomicU64,
    /// 5xx answers: the error fault and requests cut short by shutdown.
    pub server_error: AtomicU64,
    /// Connections reset by the reset fault.
    pub resets: AtomicU64,
    /// Requests that hung (counted when they start hanging).
    pub hangs: AtomicU64,
    /// Requests delayed by the slow fault.
    pub slow: AtomicU64,
    /// Prompt tokens of successful requests (estimated at four characters a token).
    pub prompt_tokens: AtomicU64,
    /// Output tokens of successful requests.
    pub generation_tokens: AtomicU64,
    /// Gauge: requests in the run stage now, hanging ones included.
    pub running: AtomicU64,
    /// Gauge: requests queued for a capacity slot now.
    pub waiting: AtomicU64,
    /// Gauge: requests hanging now.
    pub hanging: AtomicU64,
    /// High-water mark of `running`.
    pub max_running_seen: AtomicU64,
    /// Ids whose execution times were forgotten past `--remember-ids`.
    pub forgotten_ids: AtomicU64,
}

/// A point-in-time copy of the simulator's counters and gauges, as served by `GET /stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SimStats {
    /// TCP connections accepted since start: with clients that keep their connections alive,
    /// about their concurrency; far more means they open a connection per request or so.
    /// (Absent from an older simulator's `/stats`: read as 0.)
    #[serde(default)]
    pub connections_accepted: u64,
    /// Every request that reached a completion endpoint.
    pub requests: u64,
    /// Requests admitted to the run stage, whatever befell them there.
    pub executed: u64,
    /// 200 answers.
    pub ok: u64,
    /// 400 answers.
    pub bad_request: u64,
    /// 429 answers of any cause.
    pub too_many_requests: u64,
    /// 429 answers because capacity and queue were full.
    pub rejected_capacity: u64,
    /// 5xx answers.
    pub server_error: u64,
    /// Connections reset on purpose.
    pub resets: u64,
    /// Requests that hung.
    pub hangs: u64,
    /// Requests delayed by the slow fault.
    pub slow: u64,
    /// Requests running now.
    pub running: u64,
    /// Requests waiting for a slot now.
    pub waiting: u64,
    /// Requests hanging now.
    pub hanging: u64,
    /// Most requests ever running at once.
    pub max_running_seen: u64,
    /// Ids forgotten past `--remember-ids`: `/executions` and `/arrivals` no longer name them.
    /// (Absent from an older simulator's `/stats`: read as 0.)
    #[serde(default)]
    pub forgotten_ids: u64,
}

impl Stats {
    /// Counts a 200 answer of `completion_tokens` for a prompt of `prompt_tokens`;
    /// `hit_limit` when it stopped at the request's `max_tokens`.
    pub(crate) fn count_success(
        &self,
        prompt_tokens: u64,
        completion_tokens: u64,
        hit_limit: bool,
    ) {
        self.ok.fetch_add(1, Relaxed);
        if hit_limit {
            self.ok_length.fetch_add(1, Relaxed);
        }
        self.prompt_tokens.fetch_add(prompt_tokens, Relaxed);
        self.generation_tokens.fetch_add(completion_tokens, Relaxed);
    }

    /// Copies every counter.
    pub(crate) fn snapshot(&self) -> SimStats {
        SimStats {
            connections_accepted: self.connections_accepted.load(Relaxed),
            requests: self.requests.load(Relaxed),
            executed: self.executed.load(Relaxed),
            ok: self.ok.load(Relaxed),
            bad_request: self.bad_request.load(Relaxed),
            too_many_requests: self.too_many_requests.load(Relaxed),
            rejected_capacity: self.rejected_capacity.load(Relaxed),
            server_error: self.server_error.load(Relaxed),
            resets: self.resets.load(Relaxed),
            hangs: self.hangs.load(Relaxed),
            slow: self.slow.load(Relaxed),
            running: self.running.load(Relaxed),
            waiting: self.waiting.load(Relaxed),
            hanging: self.hanging.load(Relaxed),
            max_running_seen: self.max_running_seen.load(Relaxed),
            forgotten_ids: self.forgotten_ids.load(Relaxed),
        }
    }

    /// Renders the Prometheus text exposition: vLLM's gauge and counter names with a
    /// `model_name` label, so tools that watch vLLM can watch the simulator, plus a few
    /// `inferq_sim_` counters of its own. `request_gauges` false leaves out the running and
    /// waiting gauges (the engine model exports them per pod instead).
    pub(crate) fn render_prometheus(&self, model_name: &str, request_gauges: bool) -> String {
        // A label value escapes backslash, double quote and newline (the text exposition format).
        let model = model_name
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let s = self.snapshot();
        let ok_length = self.ok_length.load(Relaxed);
        let mut out = String::with_capacity(2048);
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, u64)]| {
            // Writing to a String cannot fail.
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (extra, value) in samples {
                let _ = writeln!(out, "{name}{{model_name=\"{model}\"{extra}}} {value}");
            }
        };
        if request_gauges {
            metric(
                "vllm:num_requests_running",
                "gauge",
                "Number of requests currently running.",
                &[("", s.running)],
            );
            metric(
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                &[("", s.waiting)],
            );
        }
        metric(
            "vllm:request_success_total",
            "counter",
            "Count of successfully processed requests.",
            &[
                (",finished_reason=\"stop\"", s.ok.saturating_sub(ok_length)),
                (",finished_reason=\"length\"", ok_length),
            ],
        );
        metric(
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            &[("", self.prompt_tokens.load(Relaxed))],
        );
        metric(
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            &[("", self.generation_tokens.load(Relaxed))],
        );
        metric(
            "inferq_sim_connections_accepted_total",
            "counter",
            "TCP connections accepted.",
            &[("", s.connections_accepted)],
        );
        metric(
            "inferq_sim_requests_total",
            "counter",
            "Requests that reached a completion endpoint.",
            &[("", s.requests)],
        );
        metric(
            "inferq_sim_executed_total",
            "counter",
            "Requests admitted to the run stage.",
            &[("", s.executed)],
        );
        metric(
            "inferq_sim_responses_total",
            "counter",
            "Requests by how they ended.",
            &[
                (",outcome=\"ok\"", s.ok),
                (",outcome=\"bad_request\"", s.bad_request),
                (",outcome=\"too_many_requests\"", s.too_many_requests),
                (",outcome=\"server_error\"", s.server_error),
                (",outcome=\"reset\"", s.resets),
                (",outcome=\"hang\"", s.hangs),
            ],
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_has_vllm_gauges_and_escapes_labels() {
        let stats = Stats::default();
        stats.running.store(3, Relaxed);
        stats.ok.store(5, Relaxed);
        stats.ok_length.store(2, Relaxed);
        stats.connections_accepted.store(4, Relaxed);
        let text = stats.render_prometheus("a\"b", true);
        assert!(text.contains("# TYPE vllm:num_requests_running gauge"));
        assert!(text.contains("vllm:num_requests_running{model_name=\"a\\\"b\"} 3"));
        assert!(text.contains("vllm:num_requests_waiting{model_name=\"a\\\"b\"} 0"));
        assert!(text.contains(
            "vllm:request_success_total{model_name=\"a\\\"b\",finished_reason=\"stop\"} 3"
        ));
        assert!(text.contains("# TYPE inferq_sim_connections_accepted_total counter"));
        assert!(text.contains("inferq_sim_connections_accepted_total{model_name=\"a\\\"b\"} 4"));
    }
}
