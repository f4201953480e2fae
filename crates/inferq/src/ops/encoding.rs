//! The compression of the `/metrics` page, as Go's `promhttp` (client_golang 1.23) chooses it:
//! the scraper's `Accept-Encoding` header enters, the coding to answer with leaves, and
//! [`gzip`] turns a page into that coding's bytes.
//!
//! Go offers `identity` then `gzip` and takes the first offer whose clause has the highest `q`
//! (a later offer must beat it strictly): `gzip` (Prometheus's header) or `gzip;q=0.8,
//! identity;q=0.5` get gzip; `*`, an empty header, or codings Go does not offer get the plain
//! page; a winner at `q=0` also gets the plain page. A gzip page carries `Content-Encoding:
//! gzip`, a plain one no `Content-Encoding` at all, as in Go.

use std::io::Write as _;

use flate2::write::GzEncoder;
use flate2::Compression;

/// How the page travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Gzip,
}

/// The coding Go answers a scrape whose `Accept-Encoding` header is `accept_encoding` with.
pub fn negotiate(accept_encoding: Option<&str>) -> Coding {
    let clauses: Vec<(&str, f64)> = accept_encoding
        .unwrap_or("")
        .split(',')
        .filter_map(clause)
        .collect();
    let mut best = (Coding::Identity, -1.0_f64);
    for (offer, name) in [(Coding::Identity, "identity"), (Coding::Gzip, "gzip")] {
        for &(coding, q) in &clauses {
            if q > best.1 && (coding == "*" || coding.eq_ignore_ascii_case(name)) {
                best = (offer, q);
            }
        }
    }
    if best.1 == 0.0 {
        Coding::Identity
    } else {
        best.0
    }
}

/// One `Accept-Encoding` clause: its coding and its `q` (1 when not given).
fn clause(part: &str) -> Option<(&str, f64)> {
    let mut pieces = part.split(';');
    let coding = pieces.next()?.trim();
    if coding.is_empty() {
        return None;
    }
    let mut q = 1.0;
    for (key, value) in pieces.filter_map(|p| p.split_once('=')) {
        if key.trim().eq_ignore_ascii_case("q") {
            q = value.trim().parse().ok().filter(|q: &f64| q.is_finite())?;
        }
    }
    Some((coding, q))
}

/// `page` in gzip, at the default level Go's `gzip.NewWriter` uses.
pub fn gzip(page: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(page.len() / 4), Compression::default());
    encoder.write_all(page)?;
    encoder.finish()
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    #[test]
    fn the_coding_is_go_s_for_each_kind_of_scraper() {
        use Coding::{Gzip, Identity};
        // Prometheus 2 and 3 send `gzip`; curl sends nothing, `--compressed` sends a list.
        assert_eq!(negotiate(Some("gzip")), Gzip);
        assert_eq!(negotiate(None), Identity);
        assert_eq!(negotiate(Some("")), Identity);
        assert_eq!(negotiate(Some("deflate, gzip, br, zstd")), Gzip);
        assert_eq!(negotiate(Some("GZIP")), Gzip);
        // The highest q wins; identity, offered first, wins a tie and a wildcard.
        assert_eq!(negotiate(Some("identity;q=0.5, gzip;q=0.8")), Gzip);
        assert_eq!(negotiate(Some("gzip;q=0.5, identity;q=0.8")), Identity);
        assert_eq!(negotiate(Some("gzip, identity")), Identity);
        assert_eq!(negotiate(Some("*")), Identity);
        assert_eq!(negotiate(Some("*;q=0.2, gzip;q=0.3")), Gzip);
        // Refused, or only codings Go does not offer: the plain page.
        assert_eq!(negotiate(Some("gzip;q=0")), Identity);
        assert_eq!(negotiate(Some("br, deflate")), Identity);
        // A clause whose q cannot be read counts for nothing.
        assert_eq!(negotiate(Some("gzip;q=high")), Identity);
    }

    #[test]
    fn a_gzip_page_reads_back_as_the_page() {
        let page = "# HELP a An a.\n# TYPE a counter\na_total 1\n".repeat(200);
        let packed = gzip(page.as_bytes()).expect("gzip");
        assert!(packed.len() * 10 < page.len(), "{} bytes", packed.len());
        let mut back = String::new();
        flate2::read::GzDecoder::new(packed.as_slice())
            .read_to_string(&mut back)
            .expect("gunzip");
        assert_eq!(back, page);
    }
}
