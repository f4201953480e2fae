//! The `Content-Type` of the `/metrics` page, as Go's `promhttp` (client_golang 1.23,
//! prometheus/common 0.67, `expfmt.Negotiate`, no OpenMetrics) answers a scrape: the scraper's
//! `Accept` header enters, the header value leaves. The format is always the 0.0.4 text,
//! whatever is asked for; Go adds `; escaping=` and the name-escaping scheme the scraper named,
//! in the `Accept` clauses read by falling `q` up to the first one the 0.0.4 text satisfies
//! (`underscores` when none names a known one: Prometheus 2, curl). Every inferq name is a
//! legacy name, so the scheme changes nothing in the page.

/// Go's `expfmt.FmtText`, without the `escaping` parameter [`content_type`] adds.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The `Content-Type` Go answers a scrape whose `Accept` header is `accept` with (see the
/// module comment).
pub fn content_type(accept: Option<&str>) -> String {
    format!("{TEXT_FORMAT}; escaping={}", escaping(accept.unwrap_or("")))
}

fn escaping(accept: &str) -> &str {
    const KNOWN: [&str; 4] = ["allow-utf-8", "underscores", "dots", "values"];
    let mut clauses: Vec<Clause> = accept.split(',').filter_map(Clause::parse).collect();
    // goautoneg's order: higher q first, then a concrete type, then a concrete subtype.
    clauses.sort_by(|a, b| {
        b.q.total_cmp(&a.q)
            .then((a.kind == "*").cmp(&(b.kind == "*")))
            .then((a.sub == "*").cmp(&(b.sub == "*")))
    });
    let mut scheme = "underscores";
    for clause in &clauses {
        if let Some(asked) = clause.param("escaping").filter(|e| KNOWN.contains(e)) {
            scheme = asked;
        }
        if clause.takes_text() {
            break;
        }
    }
    scheme
}

/// One `Accept` clause, parsed as goautoneg does.
struct Clause<'a> {
    kind: &'a str,
    sub: &'a str,
    q: f64,
    params: Vec<(&'a str, &'a str)>,
}

impl<'a> Clause<'a> {
    fn parse(part: &'a str) -> Option<Clause<'a>> {
        let mut pieces = part.trim_matches(' ').split(';');
        let range = pieces.next()?;
        let (kind, sub) = match range.split_once('/') {
            Some((kind, sub)) if !sub.contains('/') => {
                (kind.trim_matches(' '), sub.trim_matches(' '))
            }
            None if range.trim_matches(' ') == "*" => ("*", "*"),
            _ => return None,
        };
        let mut clause = Clause {
            kind,
            sub,
            q: 1.0,
            params: Vec::new(),
        };
        for (key, value) in pieces.filter_map(|p| p.split_once('=')) {
            match key.trim_matches(' ') {
                "q" => clause.q = value.parse().unwrap_or(0.0),
                key => clause.params.push((key, value.trim_matches(' '))),
            }
        }
        Some(clause)
    }

    fn param(&self, key: &str) -> Option<&'a str> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
    }

    /// Whether Go's `matchFormat` takes `FmtText` for this clause.
    fn takes_text(&self) -> bool {
        let plain = self.kind == "text" && self.sub == "plain";
        let version = match self.param("version") {
            None | Some("") if plain => "0.0.4",
            version => version.unwrap_or(""),
        };
        matches!(self.kind, "*" | "text") && matches!(self.sub, "*" | "plain") && version == "0.0.4"
    }
}

#[cfg(test)]
mod tests {
    use super::content_type;

    /// Go answers every scrape with the 0.0.4 text, OpenMetrics asked for or not, and names the
    /// escaping scheme the scraper asked for up to the clause the text satisfies.
    #[test]
    fn the_content_type_is_go_s_for_each_kind_of_scraper() {
        let underscores = "text/plain; version=0.0.4; charset=utf-8; escaping=underscores";
        let utf8 = "text/plain; version=0.0.4; charset=utf-8; escaping=allow-utf-8";
        // curl, and Prometheus 2's default Accept.
        assert_eq!(content_type(None), underscores);
        assert_eq!(content_type(Some("*/*")), underscores);
        let prometheus2 = "application/openmetrics-text;version=1.0.0,\
            application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(content_type(Some(prometheus2)), underscores);
        // Prometheus 3's default Accept, which offers UTF-8 names.
        let prometheus3 = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,\
            application/openmetrics-text;version=0.0.1;q=0.4,\
            text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1";
        assert_eq!(content_type(Some(prometheus3)), utf8);
        // A clause read after the one the text satisfies does not count; an unknown scheme neither.
        let late = "text/plain;q=0.9,text/plain;version=1.0.0;escaping=dots;q=0.1";
        assert_eq!(content_type(Some(late)), underscores);
        let unknown = "text/plain;version=0.0.4;escaping=rot13";
        assert_eq!(content_type(Some(unknown)), underscores);
        let dots = "text/plain;version=0.0.4;escaping=dots";
        assert_eq!(
            content_type(Some(dots)),
            "text/plain; version=0.0.4; charset=utf-8; escaping=dots"
        );
    }
}
