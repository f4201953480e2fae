//! The processor's Redis connection, and a client span per command sent on it when tracing asks
//! for them (Go's `enable_tracing`, which wraps its client with `redisotel`).
//!
//! In: a self-healing [`ConnectionManager`] and, when spans are wanted, the tracer `ops::otel`
//! started. Out: a [`Con`] that every move of the processor runs on; with spans on, each command
//! (or pipeline) it sends becomes a span named after the command (`evalsha`, `zcard`, `ping`,
//! `script load`, `pipeline`), a root span of its own: one script call serves a whole batch of
//! requests, so no request's trace is its parent. A span names the script an `EVALSHA` runs
//! (`db.stored_procedure.name`: `take`, `finish`, …) but never carries the arguments, which hold
//! the prompts (redisotel puts the whole command in `db.statement`). A command that fails marks
//! its span as an error. Without spans, the connection costs nothing over the manager's own.

use std::sync::Arc;

use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{SdkTracer, Span};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Arg, Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisError, RedisFuture, Value};

use inferq_client::scripts::SCRIPTS;
use inferq_client::target::Link;

/// A connection to Redis that may trace the commands it sends; cheap to clone (clones share
/// the connection).
#[derive(Clone)]
pub struct Con {
    inner: Link,
    spans: Option<Arc<CommandSpans>>,
}

impl std::fmt::Debug for Con {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Con").finish_non_exhaustive()
    }
}

impl Con {
    /// A connection whose commands make no spans.
    pub fn plain(inner: impl Into<Link>) -> Con {
        Con {
            inner: inner.into(),
            spans: None,
        }
    }

    /// The link underneath, for commands sent to one node (`SCAN` of a cluster's primaries).
    pub fn link(&self) -> Link {
        self.inner.clone()
    }

    /// Whether this connection goes to a Redis Cluster, whose keys are hash-tagged.
    pub fn is_cluster(&self) -> bool {
        self.inner.is_cluster()
    }

    /// See [`Link::wait_replicas`].
    pub async fn wait_replicas(
        &mut self,
        key: &str,
        wait: inferq_client::ReplicaWait,
    ) -> redis::RedisResult<u32> {
        self.inner.wait_replicas(key, wait).await
    }

    /// A connection that makes a span of every command with `tracer`; `info` names the server
    /// in the spans.
    pub fn traced(inner: impl Into<Link>, tracer: SdkTracer, info: &ConnectionInfo) -> Con {
        let inner = inner.into();
        let mut common = vec![
            KeyValue::new("db.system", "redis"),
            KeyValue::new("db.namespace", info.redis_settings().db().to_string()),
        ];
        match info.addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                common.push(KeyValue::new("server.address", host.clone()));
                common.push(KeyValue::new("server.port", i64::from(*port)));
            }
            ConnectionAddr::Unix(path) => {
                common.push(KeyValue::new("server.address", path.display().to_string()));
            }
            _ => {}
        }
        Con {
            inner,
            spans: Some(Arc::new(CommandSpans { tracer, common })),
        }
    }
}

impl From<ConnectionManager> for Con {
    fn from(inner: ConnectionManager) -> Con {
        Con::plain(inner)
    }
}

impl From<Link> for Con {
    fn from(inner: Link) -> Con {
        Con::plain(inner)
    }
}

/// What every span of one connection shares.
struct CommandSpans {
    tracer: SdkTracer,
    common: Vec<KeyValue>,
}

impl CommandSpans {
    fn start(&self, name: String, attributes: Vec<KeyValue>) -> Span {
        let mut all = self.common.clone();
        all.extend(attributes);
        self.tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes(all)
            .start(&self.tracer)
    }

    /// The span of one command.
    fn command(&self, cmd: &Cmd) -> Span {
        let mut args = cmd.args_iter().filter_map(|a| match a {
            Arg::Simple(bytes) => Some(bytes),
            _ => None,
        });
        let command = args
            .next()
            .map(|b| String::from_utf8_lossy(b).to_ascii_uppercase())
            .unwrap_or_default();
        let second = args.next();
        let mut attributes = vec![KeyValue::new("db.operation.name", command.clone())];
        let mut name = command.to_ascii_lowercase();
        match command.as_str() {
            "EVALSHA" => {
                let sha = second.map(String::from_utf8_lossy).unwrap_or_default();
                if let Some(script) = SCRIPTS.all().into_iter().find(|s| s.sha() == sha) {
                    attributes.push(KeyValue::new("db.stored_procedure.name", script.name));
                }
            }
            "SCRIPT" | "CLIENT" | "CONFIG" | "ACL" => {
                if let Some(sub) = second {
                    name.push(' ');
                    name.push_str(&String::from_utf8_lossy(sub).to_ascii_lowercase());
                }
            }
            _ => {}
        }
        self.start(name, attributes)
    }

    /// The span of one pipeline.
    fn pipeline(&self, pipeline: &Pipeline) -> Span {
        let size = i64::try_from(pipeline.len()).unwrap_or(i64::MAX);
        self.start(
            "pipeline".to_owned(),
            vec![KeyValue::new("db.operation.batch.size", size)],
        )
    }
}

/// Ends `span` with what Redis answered: an error span when the command failed, whether the
/// connection failed it or Redis answered an error (which comes back as a value here and is
/// turned into an error only when the caller reads it).
fn end<'v>(mut span: Span, answer: Result<impl IntoIterator<Item = &'v Value>, &RedisError>) {
    let failure = match answer {
        Err(e) => Some((format!("{:?}", e.kind()), e.to_string())),
        Ok(values) => values.into_iter().find_map(|v| match v {
            Value::ServerError(e) => Some((e.code().to_owned(), e.to_string())),
            _ => None,
        }),
    };
    if let Some((kind, message)) = failure {
        span.set_attribute(KeyValue::new("error.type", kind));
        span.set_status(Status::error(message));
    }
    span.end();
}

impl ConnectionLike for Con {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let Some(spans) = &self.spans else {
            return self.inner.req_packed_command(cmd);
        };
        let span = spans.command(cmd);
        Box::pin(async move {
            let answer = self.inner.req_packed_command(cmd).await;
            end(span, answer.as_ref().map(std::iter::once));
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let Some(spans) = &self.spans else {
            return self.inner.req_packed_commands(pipeline, offset, count);
        };
        let span = spans.pipeline(pipeline);
        Box::pin(async move {
            let answer = self
                .inner
                .req_packed_commands(pipeline, offset, count)
                .await;
            end(span, answer.as_ref());
            answer
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}
