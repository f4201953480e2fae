//! Where the metric gates read their signal: a Prometheus instant query, a cascade of them, or a
//! scraped `/metrics` page; each behind a TTL cache. A read leaves as the sample values (first
//! one used by the gate) or an error text; it never takes longer than the HTTP timeouts allow.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Mutex;

use super::{promql, text};

/// Per-request bound on a Prometheus query (headers and body).
pub(super) const PROMETHEUS_TIMEOUT: Duration = Duration::from_secs(5);
/// Per-request bound on a scrape, as Go's 10 s client timeout.
pub(super) const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on one whole read, however many requests it takes (a cascade makes up to three, a
/// scrape with pods two): a budget never keeps a consumer waiting longer.
pub(super) const READ_BOUND: Duration = Duration::from_secs(10);

/// What a read yields: the samples' values, or why there are none.
pub(super) type Values = Result<Vec<f64>, String>;

/// Why a metric gate's HTTP side cannot be set up (at start-up: the processor does not start).
/// Its text holds its cause too, as the gate's other errors do.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot build the HTTP client: a trusted root: {0}")]
    Root(#[source] reqwest::Error),
    #[error("cannot build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("bad --prometheus-url {shown:?}: {source}")]
    PrometheusUrl {
        /// The URL without its password.
        shown: String,
        #[source]
        source: url::ParseError,
    },
}

/// The one HTTP client every metric gate shares (connection pools are per client).
pub(super) fn client() -> Result<reqwest::Client, SetupError> {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    if let Some(c) = CLIENT.get() {
        return Ok(c.clone());
    }
    // The default roots of every TLS connection inferq makes (Go's client uses the system pool).
    let mut builder = reqwest::Client::builder()
        .connect_timeout(PROMETHEUS_TIMEOUT)
        .tls_built_in_root_certs(false);
    for cert in inferq_client::Roots::system().certs() {
        let cert = reqwest::Certificate::from_der(cert.as_ref()).map_err(SetupError::Root)?;
        builder = builder.add_root_certificate(cert);
    }
    let built = builder.build().map_err(SetupError::Client)?;
    Ok(CLIENT.get_or_init(|| built).clone())
}

/// GETs `url`; anything but 200 is an error.
async fn get(
    client: &reqwest::Client,
    url: reqwest::Url,
    timeout: Duration,
) -> Result<Bytes, String> {
    // Shown without its password; reqwest's own texts embed the full URL, so it is cut off.
    let shown = crate::config::redact_url(url.as_str());
    let response = client
        .get(url)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| format!("GET {shown}: {}", e.without_url()))?;
    let status = response.status();
    let body = response
        .bytes()
        .await
        .map_err(|e| format!("GET {shown}: reading the body: {}", e.without_url()))?;
    if status != reqwest::StatusCode::OK {
        let text = String::from_utf8_lossy(&body);
        let text: String = text.chars().take(200).collect();
        return Err(format!("GET {shown}: status {status}: {text}"));
    }
    Ok(body)
}

/// A Prometheus server's instant-query endpoint.
#[derive(Debug, Clone)]
pub(super) struct Prometheus {
    client: reqwest::Client,
    /// `<--prometheus-url>/api/v1/query`.
    endpoint: reqwest::Url,
}

impl Prometheus {
    pub(super) fn new(client: reqwest::Client, base: &str) -> Result<Prometheus, SetupError> {
        let joined = format!("{}/api/v1/query", base.trim_end_matches('/'));
        let endpoint =
            reqwest::Url::parse(&joined).map_err(|source| SetupError::PrometheusUrl {
                shown: crate::config::redact_url(base),
                source,
            })?;
        Ok(Prometheus { client, endpoint })
    }

    /// Evaluates `query` now; the result must be an instant vector.
    pub(super) async fn instant(&self, query: &str) -> Values {
        let mut url = self.endpoint.clone();
        url.query_pairs_mut().append_pair("query", query);
        let body = get(&self.client, url, PROMETHEUS_TIMEOUT).await?;
        decode_vector(&body).map_err(|e| format!("query {query:?}: {e}"))
    }
}

#[derive(Deserialize)]
struct QueryResponse {
    status: String,
    data: Option<QueryData>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct QueryData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Value,
}

#[derive(Deserialize)]
struct VectorSample {
    /// `[unix time, "value"]`.
    value: (Value, String),
}

/// The values of a `{"status":"success","data":{"resultType":"vector",…}}` answer.
fn decode_vector(body: &[u8]) -> Values {
    let response: QueryResponse =
        serde_json::from_slice(body).map_err(|e| format!("not a query response: {e}"))?;
    if response.status != "success" {
        return Err(format!(
            "status {:?}: {}",
            response.status,
            response.error.unwrap_or_default()
        ));
    }
    let data = response.data.ok_or("no data in the response")?;
    if data.result_type != "vector" {
        return Err(format!(
            "result type {:?}, want an instant vector",
            data.result_type
        ));
    }
    let samples: Vec<VectorSample> =
        serde_json::from_value(data.result).map_err(|e| format!("bad vector: {e}"))?;
    samples
        .iter()
        .map(|s| {
            text::parse_value(&s.value.1).ok_or_else(|| format!("bad sample value {:?}", s.value.1))
        })
        .collect()
}

/// A `/metrics` page to read one family from.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub url: reqwest::Url,
    pub metric: String,
    pub labels: Vec<(String, String)>,
}

/// The `endpoint-scrape` reading: a count (or a fraction) against an optional capacity.
#[derive(Debug)]
pub(super) struct Scrape {
    pub client: reqwest::Client,
    pub target: Target,
    pub max_count_per_pod: f64,
    /// Where the ready-pod count is read; the capacity is then `pods × max_count_per_pod`.
    pub pods: Option<Target>,
    /// The value assumed when the page is read but no series matches (`absent_value`); without
    /// it such a page is no reading.
    pub absent_value: Option<f64>,
    /// The metric is already a budget (`value_type: budget`), not a saturation.
    pub direct_budget: bool,
}

/// What one scrape found: the matching series' values and the capacity they count against
/// (0 when there is none).
struct Measure {
    values: Vec<f64>,
    capacity: f64,
}

impl Scrape {
    async fn values(&self, target: &Target) -> Values {
        let body = get(&self.client, target.url.clone(), SCRAPE_TIMEOUT).await?;
        let text = std::str::from_utf8(&body).map_err(|_| {
            format!(
                "{}: the page is not UTF-8",
                crate::config::redact_url(target.url.as_str())
            )
        })?;
        let page = text::parse(text)
            .map_err(|e| format!("{}: {e}", crate::config::redact_url(target.url.as_str())))?;
        Ok(page.values(&target.metric, &target.labels))
    }

    /// Scrapes the page (and the pods page when there is one); `None` when no series matches
    /// and there is no `absent_value`.
    async fn measure(&self) -> Result<Option<Measure>, String> {
        let mut values = self.values(&self.target).await?;
        if values.is_empty() {
            match self.absent_value {
                Some(v) => values.push(v),
                None => return Ok(None),
            }
        }
        let capacity = match &self.pods {
            None => self.max_count_per_pod,
            Some(pods) => {
                let counts = self.values(pods).await.map_err(|e| format!("pods: {e}"))?;
                let ready = *counts.first().ok_or_else(|| {
                    format!(
                        "pods metric {} not found at {}",
                        pods.metric,
                        crate::config::redact_url(pods.url.as_str())
                    )
                })?;
                if ready.is_nan() || ready <= 0.0 {
                    return Err(format!("ready pods is {ready}, cannot compute capacity"));
                }
                ready * self.max_count_per_pod
            }
        };
        Ok(Some(Measure { values, capacity }))
    }

    /// One value, the budget (`1 − saturation`, or the metric itself with `value_type:
    /// budget`), or none when no series matches.
    ///
    /// Several matching series combine by what they are: with a capacity (a positive
    /// `max_count_per_pod`) they are counts and are summed, since the capacity is pool-wide;
    /// without one they are already fractions and the most constraining is taken (the largest
    /// saturation, the smallest budget). Go takes the first; with a single matching series
    /// they agree.
    async fn read(&self) -> Values {
        let Some(Measure { values, capacity }) = self.measure().await? else {
            return Ok(Vec::new());
        };
        let fraction = if capacity > 0.0 {
            values.iter().sum::<f64>() / capacity
        } else {
            let pick = if self.direct_budget {
                f64::min
            } else {
                f64::max
            };
            let start = if self.direct_budget {
                f64::INFINITY
            } else {
                f64::NEG_INFINITY
            };
            values.iter().copied().fold(start, |a, b| {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else {
                    pick(a, b)
                }
            })
        };
        // `clamp` keeps NaN, which the gate then treats as unavailable.
        let fraction = fraction.clamp(0.0, 1.0);
        Ok(vec![if self.direct_budget {
            fraction
        } else {
            1.0 - fraction
        }])
    }

    /// The free capacity in the metric's own units: `capacity − used`, at least 0, with the
    /// matching series summed as `used` (`admission: counted`). An error when no series matches
    /// (without `absent_value`), or the reading is not a usable count (NaN, infinite, a
    /// negative count).
    pub(super) async fn headroom(&self) -> Result<f64, String> {
        let Some(Measure { values, capacity }) = self.measure().await? else {
            return Err(format!(
                "metric {} not found at {}",
                self.target.metric,
                crate::config::redact_url(self.target.url.as_str())
            ));
        };
        let used: f64 = values.iter().sum();
        if !used.is_finite() || used < 0.0 || values.iter().any(|v| *v < 0.0) {
            return Err(format!("{} reads {used}, not a count", self.target.metric));
        }
        let free = capacity - used;
        if !free.is_finite() {
            return Err(format!("the capacity is {capacity}, not a count"));
        }
        Ok(free.max(0.0))
    }
}

/// One way of reading a gate's signal.
#[derive(Debug)]
pub(super) enum Source {
    /// One PromQL query.
    Query {
        prometheus: Prometheus,
        query: String,
    },
    /// Several queries in order; the first with a sample wins.
    Cascade {
        prometheus: Prometheus,
        /// The gate type, for the log.
        gate: &'static str,
        queries: Vec<promql::Query>,
        /// Index of the query that won last time (`NONE` before the first read, `ALL_FAILED`
        /// when none did), to log changes only.
        winner: AtomicUsize,
    },
    /// A scraped `/metrics` page.
    Scrape(Scrape),
}

const NONE: usize = usize::MAX;
const ALL_FAILED: usize = usize::MAX - 1;

impl Source {
    pub(super) fn cascade(
        prometheus: Prometheus,
        gate: &'static str,
        queries: Vec<promql::Query>,
    ) -> Source {
        Source::Cascade {
            prometheus,
            gate,
            queries,
            winner: AtomicUsize::new(NONE),
        }
    }

    async fn read(&self) -> Values {
        match self {
            Source::Query { prometheus, query } => prometheus.instant(query).await,
            Source::Cascade {
                prometheus,
                gate,
                queries,
                winner,
            } => {
                let mut failures = Vec::new();
                for (i, query) in queries.iter().enumerate() {
                    match prometheus.instant(&query.promql).await {
                        Ok(values) if !values.is_empty() => {
                            if winner.swap(i, Ordering::Relaxed) != i {
                                tracing::info!(
                                    gate,
                                    source = i,
                                    query = %query.promql,
                                    "{gate}: reading {} (cascade source {i})",
                                    query.metrics.join(" and ")
                                );
                            }
                            return Ok(values);
                        }
                        Ok(_) => failures.push(None),
                        Err(e) => failures.push(Some(format!("source {i}: {e}"))),
                    }
                }
                // The gate logs the failure; a later winner is logged as a change.
                winner.store(ALL_FAILED, Ordering::Relaxed);
                Err(cascade_failure(queries, failures))
            }
            Source::Scrape(scrape) => scrape.read().await,
        }
    }
}

/// Why no query of a cascade answered: the metric names it tried (each once, in order) and,
/// when Prometheus itself failed, how.
fn cascade_failure(queries: &[promql::Query], failures: Vec<Option<String>>) -> String {
    let mut tried: Vec<&str> = Vec::new();
    for name in queries.iter().flat_map(|q| q.metrics) {
        if !tried.contains(&name) {
            tried.push(name);
        }
    }
    let errors: Vec<String> = failures.into_iter().flatten().collect();
    if errors.is_empty() {
        format!(
            "Prometheus has no series of any metric the gate reads (tried {}): is it scraping \
             the router, and does the pool name match?",
            tried.join(", ")
        )
    } else {
        format!(
            "no query answered (tried {}): {}",
            tried.join(", "),
            errors.join("; ")
        )
    }
}

/// A source behind a TTL cache: within `ttl` of a read, its outcome (error included) is
/// answered again without asking. Concurrent readers of an expired entry wait for one read.
#[derive(Debug)]
pub(super) struct Cached {
    source: Source,
    /// Zero: every read asks the source.
    ttl: Duration,
    last: Mutex<Option<(Instant, Values)>>,
}

impl Cached {
    pub(super) fn new(source: Source, ttl: Duration) -> Cached {
        Cached {
            source,
            ttl,
            last: Mutex::new(None),
        }
    }

    pub(super) async fn read(&self) -> Values {
        if self.ttl.is_zero() {
            return self.bounded_read().await;
        }
        let mut last = self.last.lock().await;
        if let Some((at, values)) = last.as_ref() {
            if at.elapsed() < self.ttl {
                return values.clone();
            }
        }
        let values = self.bounded_read().await;
        *last = Some((Instant::now(), values.clone()));
        values
    }

    async fn bounded_read(&self) -> Values {
        tokio::time::timeout(READ_BOUND, self.source.read())
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {READ_BOUND:?}")))
    }
}

/// Scrapes a `/metrics` page once and gives, per family asked, the values of its series whose
/// labels match `labels` (empty for a family with no matching series): what the `slack` gate's
/// signal reads, parsed as `endpoint-scrape` parses a page.
pub(in crate::dispatch::gates) async fn scrape_series(
    url: &reqwest::Url,
    families: &[&str],
    labels: &[(String, String)],
    timeout: Duration,
) -> Result<Vec<Vec<f64>>, String> {
    let client = client().map_err(|e| crate::gateway::error_chain(&e))?;
    let body = get(&client, url.clone(), timeout).await?;
    let shown = || crate::config::redact_url(url.as_str());
    let text =
        std::str::from_utf8(&body).map_err(|_| format!("{}: the page is not UTF-8", shown()))?;
    let page = text::parse(text).map_err(|e| format!("{}: {e}", shown()))?;
    Ok(families
        .iter()
        .map(|family| page.values(family, labels))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_only_instant_vectors() {
        let ok = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"a":"b"},"value":[1712345678.5,"0.25"]},
            {"metric":{},"value":[1712345678.5,"NaN"]},
            {"metric":{},"value":[1712345678.5,"+Inf"]}]}}"#;
        let values = decode_vector(ok).unwrap();
        assert_eq!(values[0], 0.25);
        assert!(values[1].is_nan());
        assert_eq!(values[2], f64::INFINITY);
        let empty = br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert_eq!(decode_vector(empty).unwrap(), Vec::<f64>::new());

        for (bad, why) in [
            (&br#"{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}"#[..], "result type \"scalar\""),
            (br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#, "parse error"),
            (br#"{"status":"success"}"#, "no data"),
            (br#"{"status":"success","data":{"resultType":"vector","result":[{"value":[1,"x"]}]}}"#, "bad sample value"),
            (br#"{"status":"success","data":{"resultType":"vector","result":[{"value":[1]}]}}"#, "bad vector"),
            (b"<html>", "not a query response"),
        ] {
            let err = decode_vector(bad).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
    }
}
