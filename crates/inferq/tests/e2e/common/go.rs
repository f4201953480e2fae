//! Requests written into Redis by hand, byte for byte as the newest Go producer writes them
//! (go-newer §1, §2): the member with `payload_ref` and `enqueue_seq`, the body at its payload
//! key, the FIFO counter, the score with its sequence fraction, and the markers, in the order of
//! Go's submit script.

/// The queue and result list of these requests.
pub(crate) const Q: &str = "request-sortedset";
pub(crate) const RESULTS: &str = "result-list";

/// A request as the newest Go producer enqueues it.
pub(crate) struct GoRequest {
    pub id: String,
    pub token: String,
    pub deadline: i64,
    /// `internal.enqueue_seq` (0: unstamped).
    pub seq: i64,
    /// The body; stored apart at the payload key when `apart`.
    pub body: String,
    pub apart: bool,
    /// Extra `internal` fields, each starting with a comma.
    pub extra_internal: String,
}

impl GoRequest {
    pub(crate) fn new(id: &str, deadline: i64, seq: i64, body: &str) -> GoRequest {
        GoRequest {
            id: id.to_owned(),
            token: inferq_client::keys::fresh_token(),
            deadline,
            seq,
            body: body.to_owned(),
            apart: true,
            extra_internal: String::new(),
        }
    }

    pub(crate) fn payload_key(&self) -> String {
        format!("request-payload:{}:{}", self.id, self.token)
    }

    /// The member's bytes: `data.payload` is `null` (Go's field has no omitempty) when the body
    /// is stored apart, and `internal.payload_ref` names the key.
    pub(crate) fn member(&self) -> String {
        let mut internal = format!(
            r#""request_token":"{}","request_queue_name":"{Q}","result_queue_name":"{RESULTS}""#,
            self.token
        );
        if self.apart {
            internal.push_str(&format!(r#","payload_ref":"{}""#, self.payload_key()));
        }
        if self.seq != 0 {
            internal.push_str(&format!(r#","enqueue_seq":{}"#, self.seq));
        }
        internal.push_str(&self.extra_internal);
        let payload = if self.apart { "null" } else { &self.body };
        format!(
            r#"{{"internal":{{{internal}}},"request_kind":"plain","data":{{"id":"{}","created":1764044000,"deadline":{},"payload":{payload},"model":"m-data"}}}}"#,
            self.id, self.deadline
        )
    }

    /// Go's score: `deadline + min(seq, 2^21 - 1) / 2^21`.
    pub(crate) fn score(&self) -> f64 {
        self.deadline as f64 + self.seq.clamp(0, (1 << 21) - 1) as f64 / (1u64 << 21) as f64
    }

    /// Enqueues as Go's submit script does, in its order: the counter, the cancel marker, the
    /// active marker, the member, then the body.
    pub(crate) async fn enqueue(&self, con: &mut redis::aio::ConnectionManager) {
        let ttl_ms = self.deadline * 1000 - inferq_client::producer::unix_ms();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("INCR")
            .arg(format!("request-seq:{Q}:{}", self.deadline))
            .cmd("EXPIREAT")
            .arg(format!("request-seq:{Q}:{}", self.deadline))
            .arg(self.deadline + 3600)
            .cmd("DEL")
            .arg(format!("request-cancel:{}", self.id))
            .cmd("SET")
            .arg(format!("request-active:{}", self.id))
            .arg(&self.token)
            .arg("PX")
            .arg(ttl_ms)
            .cmd("ZADD")
            .arg(Q)
            .arg(self.score())
            .arg(self.member());
        if self.apart {
            pipe.cmd("SET")
                .arg(self.payload_key())
                .arg(&self.body)
                .arg("PX")
                .arg(ttl_ms + 600_000);
        }
        let _: () = pipe.query_async(con).await.unwrap();
    }
}
