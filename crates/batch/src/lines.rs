//! Reading JSONL: [`LineSplitter`] cuts a byte stream into lines without holding more than one
//! line (the upload check, ingestion and finalization all stream), and [`decode_line`] checks
//! one batch input line as OpenAI does and hands back its parts, the body as its exact bytes.

use serde::Deserialize;
use serde_json::value::RawValue;

/// One input line, as a batch takes it.
#[derive(Debug)]
pub struct InputLine<'a> {
    pub custom_id: String,
    pub url: String,
    /// The request body, byte for byte as the line holds it.
    pub body: &'a RawValue,
}

/// Why a line is refused: OpenAI's error code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    pub code: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
}

impl LineError {
    fn new(code: &'static str, message: impl Into<String>, param: Option<&'static str>) -> Self {
        LineError {
            code,
            message: message.into(),
            param,
        }
    }
}

#[derive(Deserialize)]
struct Loose<'a> {
    #[serde(default)]
    custom_id: Option<serde_json::Value>,
    #[serde(default)]
    method: Option<serde_json::Value>,
    #[serde(default)]
    url: Option<serde_json::Value>,
    #[serde(default, borrow)]
    body: Option<&'a RawValue>,
}

/// Checks one line of a batch's input file against the batch's `endpoint`; the first fault.
pub fn decode_line<'a>(line: &'a [u8], endpoint: &str) -> Result<InputLine<'a>, LineError> {
    decode_line_all(line, endpoint).map_err(|mut faults| faults.swap_remove(0))
}

/// [`decode_line`], with every fault of the line (at least one): a line that is not a JSON
/// object has that one, else each field is checked and each bad one named.
pub fn decode_line_all<'a>(
    line: &'a [u8],
    endpoint: &str,
) -> Result<InputLine<'a>, Vec<LineError>> {
    let loose = loose(line).map_err(|e| vec![e])?;
    let custom_id = custom_id(loose.custom_id);
    let method = check_method(loose.method);
    let url = check_url(loose.url, endpoint);
    let body = body(loose.body);
    match (custom_id, method, url, body) {
        (Ok(custom_id), Ok(()), Ok(url), Ok(body)) => Ok(InputLine {
            custom_id,
            url,
            body,
        }),
        (custom_id, method, url, body) => {
            Err([custom_id.err(), method.err(), url.err(), body.err()]
                .into_iter()
                .flatten()
                .collect())
        }
    }
}

/// The line as an object whose fields are looked at one by one.
fn loose(line: &[u8]) -> Result<Loose<'_>, LineError> {
    // serde would read a JSON array into the struct by position: a line must be an object.
    if line.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(LineError::new(
            "invalid_json_line",
            "This line is not a JSON object.",
            None,
        ));
    }
    serde_json::from_slice(line).map_err(|e| {
        LineError::new(
            "invalid_json_line",
            format!(
                "This line is not parseable as valid JSON: {}",
                within_line(&e)
            ),
            None,
        )
    })
}

/// serde's message about one line, placed by its column: serde counts the line it was given
/// as line 1, which is not the line of the file the error object names.
fn within_line(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let place = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&place) {
        Some(what) => format!("{what} at column {}", e.column()),
        None => text,
    }
}

fn custom_id(value: Option<serde_json::Value>) -> Result<String, LineError> {
    match value {
        Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(s),
        Some(serde_json::Value::String(_)) | None | Some(serde_json::Value::Null) => {
            Err(missing("custom_id"))
        }
        Some(_) => Err(LineError::new(
            "invalid_custom_id",
            "'custom_id' must be a string.",
            Some("custom_id"),
        )),
    }
}

fn body(value: Option<&RawValue>) -> Result<&RawValue, LineError> {
    match value {
        Some(b) if b.get().starts_with('{') => Ok(b),
        None => Err(missing("body")),
        Some(_) => Err(LineError::new(
            "invalid_body",
            "'body' must be a JSON object.",
            Some("body"),
        )),
    }
}

fn missing(field: &'static str) -> LineError {
    LineError::new(
        "missing_required_parameter",
        format!("Missing required parameter: '{field}'."),
        Some(field),
    )
}

fn check_method(method: Option<serde_json::Value>) -> Result<(), LineError> {
    match method {
        Some(serde_json::Value::String(m)) if m == "POST" => Ok(()),
        None | Some(serde_json::Value::Null) => Err(missing("method")),
        Some(_) => Err(LineError::new(
            "invalid_method",
            "Only the POST method is supported: 'method' must be \"POST\".",
            Some("method"),
        )),
    }
}

fn check_url(url: Option<serde_json::Value>, endpoint: &str) -> Result<String, LineError> {
    let url = match url {
        Some(serde_json::Value::String(u)) => u,
        None | Some(serde_json::Value::Null) => return Err(missing("url")),
        Some(_) => {
            return Err(LineError::new(
                "invalid_url",
                "'url' must be a string.",
                Some("url"),
            ))
        }
    };
    if url != endpoint {
        return Err(LineError::new(
            "mismatched_endpoint",
            format!("The url '{url}' does not match the batch's endpoint '{endpoint}'."),
            Some("url"),
        ));
    }
    Ok(url)
}

/// Whether a line is blank (only whitespace): blank lines are skipped everywhere, and keep
/// their place in the line numbering.
pub fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// What gets each line, with its 1-based number; an error stops the split.
pub type EachLine<'a, E> = dyn FnMut(u64, &[u8]) -> Result<(), E> + Send + 'a;

/// What [`LineSplitter::push`] found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitError {
    /// A line grew past the longest allowed (its 1-based number).
    TooLong { line: u64, limit: usize },
}

/// Cuts bytes that arrive in chunks into lines (without the `\n`, a `\r` before it dropped).
/// Holds at most one unfinished line, refused once it passes `max_line`.
#[derive(Debug)]
pub struct LineSplitter {
    partial: Vec<u8>,
    max_line: usize,
    /// Lines handed out so far.
    pub lines: u64,
}

impl LineSplitter {
    pub fn new(max_line: usize) -> LineSplitter {
        LineSplitter {
            partial: Vec::new(),
            max_line,
            lines: 0,
        }
    }

    /// Feeds a chunk; `each` gets every line it finishes, with its 1-based number, and may stop
    /// the split by returning an error.
    pub fn push<E: From<SplitError>>(
        &mut self,
        mut chunk: &[u8],
        each: &mut EachLine<'_, E>,
    ) -> Result<(), E> {
        while let Some(at) = chunk.iter().position(|&b| b == b'\n') {
            let (head, rest) = chunk.split_at(at);
            chunk = &rest[1..];
            self.lines += 1;
            if self.partial.is_empty() {
                self.check_len(head.len())?;
                each(self.lines, trim_cr(head))?;
            } else {
                self.check_len(self.partial.len() + head.len())?;
                self.partial.extend_from_slice(head);
                let line = std::mem::take(&mut self.partial);
                each(self.lines, trim_cr(&line))?;
            }
        }
        self.check_len(self.partial.len() + chunk.len())
            .map_err(|e| match e {
                SplitError::TooLong { limit, .. } => SplitError::TooLong {
                    line: self.lines + 1,
                    limit,
                },
            })?;
        self.partial.extend_from_slice(chunk);
        Ok(())
    }

    /// Ends the input: a last line without a `\n` is handed out too.
    pub fn finish<E>(&mut self, each: &mut EachLine<'_, E>) -> Result<(), E> {
        if !self.partial.is_empty() {
            self.lines += 1;
            let line = std::mem::take(&mut self.partial);
            each(self.lines, trim_cr(&line))?;
        }
        Ok(())
    }

    fn check_len(&self, len: usize) -> Result<(), SplitError> {
        if len > self.max_line {
            return Err(SplitError::TooLong {
                line: self.lines,
                limit: self.max_line,
            });
        }
        Ok(())
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EP: &str = "/v1/chat/completions";

    /// Issue 44: a bad line's every fault is listed, and a JSON fault is placed by its column
    /// (not "at line 1", which is not the file's line).
    #[test]
    fn every_fault_of_a_line_is_named_and_json_faults_by_column() {
        let faults = decode_line_all(
            br#"{"custom_id": 7, "method": "GET", "url": "/v1/chat/completions", "body": 1}"#,
            "/v1/chat/completions",
        )
        .unwrap_err();
        let codes: Vec<&str> = faults.iter().map(|f| f.code).collect();
        assert_eq!(
            codes,
            ["invalid_custom_id", "invalid_method", "invalid_body"]
        );
        let faults =
            decode_line_all(br#"{"custom_id": "a", "body": {"x": 1,}}"#, "/v1/x").unwrap_err();
        assert_eq!(faults.len(), 1);
        let message = &faults[0].message;
        assert!(message.ends_with("at column 36"), "{message}");
        assert!(!message.contains("line 1"), "{message}");
    }

    #[test]
    fn a_good_line_keeps_its_body_bytes() {
        let line = br#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m", "x" : 1}}"#;
        let l = decode_line(line, EP)
            .map_err(|e| e.message)
            .unwrap_or_else(|m| panic!("{m}"));
        assert_eq!(l.custom_id, "a");
        assert_eq!(l.body.get(), r#"{"model":"m", "x" : 1}"#);
    }

    #[test]
    fn bad_lines_name_their_fault() {
        let cases: [(&[u8], &str); 7] = [
            (b"{not json", "invalid_json_line"),
            (
                br#"{"method":"POST","url":"/v1/chat/completions","body":{}}"#,
                "missing_required_parameter",
            ),
            (
                br#"{"custom_id":"a","method":"GET","url":"/v1/chat/completions","body":{}}"#,
                "invalid_method",
            ),
            (
                br#"{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{}}"#,
                "mismatched_endpoint",
            ),
            (
                br#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":[1]}"#,
                "invalid_body",
            ),
            (
                br#"{"custom_id":7,"method":"POST","url":"/v1/chat/completions","body":{}}"#,
                "invalid_custom_id",
            ),
            (b"[1,2]", "invalid_json_line"),
        ];
        for (line, code) in cases {
            match decode_line(line, EP) {
                Err(e) => assert_eq!(e.code, code, "{}", String::from_utf8_lossy(line)),
                Ok(_) => panic!("accepted {}", String::from_utf8_lossy(line)),
            }
        }
    }

    fn split(chunks: &[&[u8]], max: usize) -> Result<Vec<(u64, Vec<u8>)>, SplitError> {
        let mut s = LineSplitter::new(max);
        let mut out = Vec::new();
        for c in chunks {
            s.push::<SplitError>(c, &mut |n, l| {
                out.push((n, l.to_vec()));
                Ok(())
            })?;
        }
        s.finish::<SplitError>(&mut |n, l| {
            out.push((n, l.to_vec()));
            Ok(())
        })?;
        Ok(out)
    }

    /// A body is checked against JSON's grammar, as Python's `json` reads it: half a surrogate
    /// pair alone in a `\u` escape (RFC 8259, 8.2) and a number too big for a float are
    /// accepted and their bytes go on untouched (the fuzzer found both; a gateway may still
    /// refuse the request, and its answer is then the line's result).
    #[test]
    fn json_that_serde_cannot_hold_goes_through_untouched() {
        for body in [r#"{"m\udFFd":"x"}"#, r#"{"m":"\ud800"}"#, r#"{"x":1e999}"#] {
            let line = format!(
                r#"{{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{body}}}"#
            );
            let l = decode_line(line.as_bytes(), EP)
                .map_err(|e| e.message)
                .unwrap_or_else(|m| panic!("{body}: {m}"));
            assert_eq!(l.body.get(), body);
        }
        let bad = br#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"m":"\ud8"}}"#;
        assert!(decode_line(bad, EP).is_err());
    }

    #[test]
    fn lines_cross_chunks_and_crlf_is_dropped() {
        let out = split(&[b"ab", b"c\r\nd", b"e\n\nf"], 10).unwrap_or_default();
        let lines: Vec<&[u8]> = out.iter().map(|(_, l)| l.as_slice()).collect();
        assert_eq!(lines, vec![&b"abc"[..], b"de", b"", b"f"]);
        assert_eq!(out.last().map(|(n, _)| *n), Some(4));
    }

    #[test]
    fn a_line_past_the_limit_is_refused_while_it_streams() {
        assert_eq!(
            split(&[b"12345", b"678"], 6),
            Err(SplitError::TooLong { line: 1, limit: 6 })
        );
        assert!(split(&[b"123456\n"], 6).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = decode_line(&bytes, EP);
        }

        #[test]
        fn splitting_in_any_chunks_gives_the_same_lines(text in "[a-c\n]{0,60}", cut in 0usize..60) {
            let bytes = text.as_bytes();
            let cut = cut.min(bytes.len());
            let whole = split(&[bytes], 100);
            let parts = split(&[&bytes[..cut], &bytes[cut..]], 100);
            proptest::prop_assert_eq!(whole, parts);
        }
    }
}
