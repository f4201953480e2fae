//! Floats spelled as the Go processor's `/metrics` spells them, so a series (above all a
//! histogram's `le` label) is the same string from a Go replica and an inferq one: an `f64`
//! enters, its text leaves.
//!
//! client_golang's text writer (`prometheus/common` `expfmt/text_create.go`, `writeFloat`) writes
//! `1`, `0` (for `-0` too), `-1`, `NaN`, `+Inf` and `-Inf` itself and everything else with
//! `strconv.AppendFloat(f, 'g', -1, 64)`. With precision -1, Go's `strconv` (`ftoa.go`,
//! `formatDigits`) takes the shortest digits that read back as the same `f64` and, because the
//! precision is the shortest, decides between the two layouts with `eprec = 6`: `%e` when the
//! decimal exponent is below -4 or at least 6 (`1.8e+06`, `1e-05`), `%f` otherwise (`1000`,
//! `120000`, `0.005`). The `%e` exponent has a sign and at least two digits.
//!
//! Rust's `{:e}` gives the same shortest digits except when two candidates of that length are
//! exactly equally close: Go's Ryu rounds that tie to even, Rust up. So the digits are taken
//! from the correctly rounded form of that length (Rust rounds ties to even there too) whenever
//! it reads back as the same value.

use std::fmt::Write;

/// `v` as Go's Prometheus text writer spells it.
pub fn go_float(v: f64) -> String {
    let mut out = String::new();
    write_go_float(&mut out, v);
    out
}

/// Appends `v` as Go's Prometheus text writer spells it.
pub fn write_go_float(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
        return;
    }
    if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
        return;
    }
    if v == 0.0 {
        out.push('0');
        return;
    }
    if v < 0.0 {
        out.push('-');
    }
    let (digits, exponent) = shortest(v.abs());
    if !(-4..6).contains(&exponent) {
        let (first, rest) = digits.split_at(1);
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        let sign = if exponent < 0 { '-' } else { '+' };
        let _ = write!(out, "e{sign}{:02}", exponent.unsigned_abs());
        return;
    }
    // %f: `point` digits before the decimal point (zero-padded), the rest after it.
    let point = exponent + 1;
    if point <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', point.unsigned_abs() as usize));
        out.push_str(&digits);
        return;
    }
    let point = point as usize;
    if digits.len() <= point {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', point - digits.len()));
    } else {
        out.push_str(&digits[..point]);
        out.push('.');
        out.push_str(&digits[point..]);
    }
}

/// The shortest round-trip digits of a finite `v > 0` (no trailing zeros) and the decimal
/// exponent of the first one, with Go's tie rule (see the module comment).
fn shortest(v: f64) -> (String, i32) {
    let (digits, exponent) = split(&format!("{v:e}"));
    let exact = format!("{v:.*e}", digits.len().saturating_sub(1));
    if exact.parse::<f64>() == Ok(v) {
        let (even, even_exponent) = split(&exact);
        return (even, even_exponent);
    }
    (digits, exponent)
}

/// `d.ddde±x` (Rust's `{:e}`) as its digits without trailing zeros and its exponent.
fn split(sci: &str) -> (String, i32) {
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((sci, "0"));
    let mut digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    while digits.len() > 1 && digits.ends_with('0') {
        digits.pop();
    }
    (digits, exponent.parse().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::go_float;

    /// What Go's `strconv.FormatFloat(v, 'g', -1, 64)` (with expfmt's special cases) prints.
    #[test]
    fn floats_are_spelled_as_go_writes_them() {
        let cases: &[(f64, &str)] = &[
            (1000.0, "1000"),
            (2.5e3, "2500"),
            (3.0, "3"),
            (1.0, "1"),
            (-1.0, "-1"),
            (0.0, "0"),
            (-0.0, "0"),
            (0.5, "0.5"),
            (0.005, "0.005"),
            (0.0001, "0.0001"),
            (1e-5, "1e-05"),
            (1.2e5, "120000"),
            (999_999.0, "999999"),
            (1e6, "1e+06"),
            (1.8e6, "1.8e+06"),
            (1_234_567.0, "1.234567e+06"),
            (2.16e7, "2.16e+07"),
            (8.64e7, "8.64e+07"),
            (1e21, "1e+21"),
            (1.5e300, "1.5e+300"),
            (5e-324, "5e-324"),
            (0.1 + 0.2, "0.30000000000000004"),
            (-2.5, "-2.5"),
            (-1.8e6, "-1.8e+06"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ];
        for &(v, want) in cases {
            assert_eq!(go_float(v), want, "{v:?}");
        }
    }

    /// 2^49 + 0.25 lies exactly halfway between the two 16-digit candidates; Go's Ryu keeps the
    /// even one, where Rust's own shortest form rounds up (`562949953421312.3`).
    #[test]
    fn an_exact_tie_between_shortest_candidates_goes_to_the_even_one_as_in_go() {
        assert_eq!(go_float(2f64.powi(49) + 0.25), "5.629499534213122e+14");
    }
}
