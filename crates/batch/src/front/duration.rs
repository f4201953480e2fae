//! Go's duration syntax (`time.ParseDuration`), for `x-llm-d-async-timeout`: a sequence of
//! decimal numbers, each with an optional fraction and a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`,
//! `h`), such as `300ms`, `1.5h` or `2h45m`. Only positive durations are deadlines.

use std::time::Duration;

/// The duration `text` names, or why it names none (zero and negative durations included).
pub fn parse_go(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a Go duration such as 30s, 1.5m or 2h45m");
    let mut rest = text.trim();
    if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    }
    if rest.starts_with('-') {
        return Err(format!(
            "{text:?} is negative: a deadline must be in the future"
        ));
    }
    if rest.is_empty() {
        return Err(bad());
    }
    if rest == "0" {
        return Err(format!(
            "{text:?} is zero: a deadline must be in the future"
        ));
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    if !total.is_finite() || total > 1e10 {
        return Err(bad());
    }
    let d = Duration::from_secs_f64(total);
    if d.is_zero() {
        return Err(format!(
            "{text:?} is zero: a deadline must be in the future"
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_as_go_parses_them() {
        let ok = |t: &str| parse_go(t).ok();
        assert_eq!(ok("30s"), Some(Duration::from_secs(30)));
        assert_eq!(ok("1.5m"), Some(Duration::from_secs(90)));
        assert_eq!(ok("2h45m"), Some(Duration::from_secs(9900)));
        assert_eq!(ok("300ms"), Some(Duration::from_millis(300)));
        assert_eq!(ok("1h0m0.5s"), Some(Duration::from_millis(3_600_500)));
        for bad in ["", "10", "5x", "-1s", "0", "0s", "s", "1..2s", "abc"] {
            assert!(parse_go(bad).is_err(), "{bad:?}");
        }
    }
}
