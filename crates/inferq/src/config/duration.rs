//! Duration flags in Go's syntax. Go's flags take `time.ParseDuration` strings (`5m`, `1m30s`,
//! `500ms`, `1.5h`, `0`); [`parse_duration`] accepts exactly those, and, as a convenience, what
//! `humantime` accepts (`5 min`). The flag loader turns a failure into a
//! [`ConfigError`](super::ConfigError) naming the flag.

use std::time::Duration;

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurationError {
    /// Neither Go's syntax nor humantime's.
    Syntax,
    /// Go accepts negative durations, but no inferq setting can use one.
    Negative,
    /// Beyond Go's limit (about 292 years).
    TooLarge,
}

/// Parses a Go duration (`1m30s`, `300ms`, `.5s`, `2h45m`, `0`), falling back to humantime.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    match parse_go(text) {
        Ok(d) => Ok(d),
        Err(DurationError::Syntax) => match humantime::parse_duration(text) {
            // The same limit as Go's syntax: humantime reaches far beyond it ("1000years").
            Ok(d) if d > Duration::from_nanos(i64::MAX as u64) => Err(DurationError::TooLarge),
            Ok(d) => Ok(d),
            Err(_) => Err(DurationError::Syntax),
        },
        Err(other) => Err(other),
    }
}

/// Nanoseconds per unit, longest unit names first so `ms` wins over `m`.
const UNITS: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("\u{b5}s", 1_000),
    ("\u{3bc}s", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Go's `time.ParseDuration`, restricted to non-negative results.
fn parse_go(text: &str) -> Result<Duration, DurationError> {
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(DurationError::Syntax);
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_digits, after_int) = rest.split_at(int_len);
        let (frac_digits, after_number) = match after_int.strip_prefix('.') {
            Some(f) => {
                let frac_len = f.bytes().take_while(u8::is_ascii_digit).count();
                f.split_at(frac_len)
            }
            None => ("", after_int),
        };
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(DurationError::Syntax);
        }
        let unit_len = after_number
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after_number.len());
        let (unit_name, after_unit) = after_number.split_at(unit_len);
        let per_unit = UNITS
            .iter()
            .find(|(name, _)| *name == unit_name)
            .map(|&(_, ns)| ns)
            .ok_or(DurationError::Syntax)?;
        let whole: u128 = if int_digits.is_empty() {
            0
        } else {
            int_digits.parse().map_err(|_| DurationError::TooLarge)?
        };
        let value = whole.checked_mul(per_unit).ok_or(DurationError::TooLarge)?;
        // Fraction: at most 18 digits matter below a nanosecond for any unit.
        let mut scale: u128 = 1;
        let mut frac: u128 = 0;
        for digit in frac_digits.bytes().take(18) {
            frac = frac * 10 + u128::from(digit - b'0');
            scale *= 10;
        }
        total = total
            .checked_add(value)
            .and_then(|t| t.checked_add(frac * per_unit / scale))
            .ok_or(DurationError::TooLarge)?;
        if total > i64::MAX as u128 {
            return Err(DurationError::TooLarge);
        }
        rest = after_unit;
    }
    if negative && total > 0 {
        return Err(DurationError::Negative);
    }
    let nanos = u64::try_from(total).map_err(|_| DurationError::TooLarge)?;
    Ok(Duration::from_nanos(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Duration {
        match parse_duration(text) {
            Ok(d) => d,
            Err(e) => panic!("{text:?}: {e:?}"),
        }
    }

    #[test]
    fn go_forms() {
        assert_eq!(ok("5m"), Duration::from_secs(300));
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("300s"), Duration::from_secs(300));
        assert_eq!(ok("2h45m"), Duration::from_secs(2 * 3600 + 45 * 60));
        assert_eq!(ok("1.5h"), Duration::from_secs(5400));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("1.s"), Duration::from_secs(1));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("-0"), Duration::ZERO);
        assert_eq!(ok("+15s"), Duration::from_secs(15));
        assert_eq!(ok("10us"), Duration::from_micros(10));
        assert_eq!(ok("10\u{b5}s"), Duration::from_micros(10));
        assert_eq!(ok("10\u{3bc}s"), Duration::from_micros(10));
        assert_eq!(ok("7ns"), Duration::from_nanos(7));
        assert_eq!(ok("1h1m1s1ms"), Duration::from_millis(3_661_001));
        assert_eq!(ok("0.000000001s"), Duration::from_nanos(1));
    }

    #[test]
    fn humantime_fallback() {
        assert_eq!(ok("5 min"), Duration::from_secs(300));
        assert_eq!(ok("2m 30s"), Duration::from_secs(150));
    }

    #[test]
    fn refusals() {
        for bad in ["5x", "", "300", "s", ".s", "1m30", "abc", "-", "1..5s"] {
            assert_eq!(parse_duration(bad), Err(DurationError::Syntax), "{bad:?}");
        }
        assert_eq!(parse_duration("-5s"), Err(DurationError::Negative));
        assert_eq!(parse_duration("3000000h"), Err(DurationError::TooLarge));
        let huge = format!("{}h", "9".repeat(45));
        assert_eq!(parse_duration(&huge), Err(DurationError::TooLarge));
        // Go's limit holds for humantime's spellings too.
        assert_eq!(parse_duration("1000years"), Err(DurationError::TooLarge));
        assert_eq!(
            parse_duration("292years"),
            Ok(Duration::from_secs(292 * 31_557_600))
        );
    }
}
