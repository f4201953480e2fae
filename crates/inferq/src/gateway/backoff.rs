//! When to try a retryable request again: Go's equal-jitter exponential backoff, honouring the
//! gateway's `Retry-After` without ever overshooting the deadline (go-compat §5.5, tests §11.5).
//!
//! In: the retry number (the message's retry count after this retry is counted), the whole
//! seconds left to the deadline, the parsed `Retry-After`, and a random source (injected so tests
//! are deterministic). Out: a [`RetryDecision`].
//!
//! - `backoff(n, s)`: `cap = min(60, s)`, `temp = min(cap, 2 × 2^n)`, uniform in
//!   `[temp/2, temp)`; zero if `s ≤ 0`. So retry 1 waits [2,4) s, 2 → [4,8), 3 → [8,16),
//!   4 → [16,32), 5 and later → [30,60) (less when the deadline is closer).
//! - `Retry-After` (only when longer than that backoff): `clamped = min(RA, s/2)`, and the backoff
//!   becomes `max(backoff, clamped × (1 + U[0,1)/4))`, at most 0.625·s — the retry always lands
//!   before the deadline.
//! - `s ≤ 0`: the deadline has passed; there is no retry count limit, this is the only give-up.

use std::time::{Duration, SystemTime};

use rand::Rng;

/// The longest backoff, in seconds, before `Retry-After`.
pub const MAX_BACKOFF_SECS: f64 = 60.0;

/// What to do with a retryable attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Park the request and retry it after this long.
    Backoff(Duration),
    /// No time is left: publish the last HTTP response if there was one, else
    /// `DEADLINE_EXCEEDED`.
    DeadlineExceeded,
}

/// Decides the retry of a request whose retry count has just been incremented to
/// `retry_count_after_increment` (Go computes `expBackoff(retry_count + 1, s)`), with
/// `seconds_to_deadline = deadline − now` in whole seconds.
pub fn retry_decision(
    retry_count_after_increment: u32,
    seconds_to_deadline: i64,
    retry_after: Option<Duration>,
    rng: &mut impl Rng,
) -> RetryDecision {
    if seconds_to_deadline <= 0 {
        return RetryDecision::DeadlineExceeded;
    }
    let backoff = exp_backoff(retry_count_after_increment, seconds_to_deadline, rng);
    RetryDecision::Backoff(honour_retry_after(
        backoff,
        retry_after,
        seconds_to_deadline,
        rng,
    ))
}

/// Equal-jitter exponential backoff for retry number `n` with `seconds_to_deadline` left.
pub fn exp_backoff(n: u32, seconds_to_deadline: i64, rng: &mut impl Rng) -> Duration {
    if seconds_to_deadline <= 0 {
        return Duration::ZERO;
    }
    // i64 → f64 is exact far beyond any deadline worth having.
    let cap = MAX_BACKOFF_SECS.min(seconds_to_deadline as f64);
    // Past n = 64 the exponential is far above any cap; clamping keeps powi in range.
    let exponential = 2.0 * 2f64.powi(n.min(64) as i32);
    let temp = cap.min(exponential);
    let u: f64 = rng.random();
    Duration::from_secs_f64(temp / 2.0 + u * temp / 2.0)
}

/// Lengthens `backoff` to honour a longer `Retry-After`, clamped to half the time left and
/// jittered up by at most a quarter.
pub fn honour_retry_after(
    backoff: Duration,
    retry_after: Option<Duration>,
    seconds_to_deadline: i64,
    rng: &mut impl Rng,
) -> Duration {
    let Some(retry_after) = retry_after else {
        return backoff;
    };
    if retry_after <= backoff || seconds_to_deadline <= 0 {
        return backoff;
    }
    let half_left = Duration::from_secs(seconds_to_deadline.unsigned_abs()) / 2;
    let clamped = retry_after.min(half_left);
    let u: f64 = rng.random();
    backoff.max(clamped.mul_f64(1.0 + u / 4.0))
}

/// Parses a `Retry-After` value as Go does: a non-negative integer number of seconds (an optional
/// `+` sign is accepted, like Go's `strconv.Atoi`), or an HTTP-date (RFC 1123, RFC 850 or asctime;
/// a date in the past means zero). Anything else — negative numbers, fractions, garbage — is
/// `None` (Go's zero, which never exceeds a backoff).
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    if value.is_empty() {
        return None;
    }
    if let Ok(seconds) = value.parse::<i64>() {
        return u64::try_from(seconds).ok().map(Duration::from_secs);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{RngCore, SeedableRng};

    /// A "random" source that always yields the same word: 0 gives U = 0.0, u64::MAX gives the
    /// largest U below 1.0, so the bounds of every range can be hit exactly.
    struct Fixed(u64);

    impl RngCore for Fixed {
        fn next_u32(&mut self) -> u32 {
            (self.0 >> 32) as u32
        }
        fn next_u64(&mut self) -> u64 {
            self.0
        }
        fn fill_bytes(&mut self, dst: &mut [u8]) {
            for (i, b) in dst.iter_mut().enumerate() {
                *b = self.0.to_le_bytes()[i % 8];
            }
        }
    }

    const LOW: u64 = 0;
    const HIGH: u64 = u64::MAX;

    fn secs(d: Duration) -> f64 {
        d.as_secs_f64()
    }

    /// Asserts that every draw (the two extremes and many seeded ones) lands in [lo, hi).
    fn assert_range(lo: f64, hi: f64, mut draw: impl FnMut(&mut dyn FnMut() -> f64) -> f64) {
        let mut low = Fixed(LOW);
        let mut high = Fixed(HIGH);
        let at_low = draw(&mut || low.random::<f64>());
        let at_high = draw(&mut || high.random::<f64>());
        assert!(
            (at_low - lo).abs() < 1e-6,
            "lowest draw {at_low}, want {lo}"
        );
        // The top of a range is open in exact arithmetic; f64 rounding may land on it.
        assert!(
            at_high <= hi && hi - at_high < 1e-6,
            "highest draw {at_high}, want just below {hi}"
        );
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..1000 {
            let v = draw(&mut || rng.random::<f64>());
            assert!(v >= lo - 1e-9 && v < hi, "{v} outside [{lo}, {hi})");
        }
    }

    /// Runs `retry_decision` with the uniform draws supplied by `next`.
    fn decide(n: u32, s: i64, ra: Option<u64>, next: &mut dyn FnMut() -> f64) -> f64 {
        struct Draws<'a>(&'a mut dyn FnMut() -> f64);
        impl RngCore for Draws<'_> {
            fn next_u32(&mut self) -> u32 {
                (self.next_u64() >> 32) as u32
            }
            fn next_u64(&mut self) -> u64 {
                // Inverse of rand's f64 mapping: the top 53 bits carry U.
                (((self.0)() * (1u64 << 53) as f64) as u64) << 11
            }
            fn fill_bytes(&mut self, _: &mut [u8]) {}
        }
        match retry_decision(n, s, ra.map(Duration::from_secs), &mut Draws(next)) {
            RetryDecision::Backoff(d) => secs(d),
            RetryDecision::DeadlineExceeded => f64::NAN,
        }
    }

    #[test]
    fn exp_backoff_ranges() {
        // Go's ExpBackoffDuration: plenty of time left.
        for (n, lo, hi) in [
            (1, 2.0, 4.0),
            (2, 4.0, 8.0),
            (3, 8.0, 16.0),
            (4, 16.0, 32.0),
            (5, 30.0, 60.0),
            (6, 30.0, 60.0),
            (40, 30.0, 60.0),
            (u32::MAX, 30.0, 60.0),
        ] {
            assert_range(lo, hi, |next| decide(n, 10_000, None, next));
        }
    }

    #[test]
    fn exp_backoff_is_capped_by_the_deadline() {
        // cap = min(60, s): 10 s left caps retry 3 at [5, 10).
        assert_range(5.0, 10.0, |next| decide(3, 10, None, next));
        assert_eq!(exp_backoff(1, 0, &mut Fixed(HIGH)), Duration::ZERO);
        assert_eq!(exp_backoff(1, -5, &mut Fixed(HIGH)), Duration::ZERO);
    }

    #[test]
    fn deadline_passed_or_exact() {
        for s in [0, -1, i64::MIN] {
            assert_eq!(
                retry_decision(1, s, Some(Duration::from_secs(5)), &mut Fixed(LOW)),
                RetryDecision::DeadlineExceeded
            );
        }
        assert!(matches!(
            retry_decision(1, 1, None, &mut Fixed(LOW)),
            RetryDecision::Backoff(_)
        ));
    }

    #[test]
    fn retry_after_honored() {
        // RA 30 s, 100 s left: clamped = min(30, 50) = 30 → [30, 37.5).
        assert_range(30.0, 37.5, |next| decide(1, 100, Some(30), next));
    }

    #[test]
    fn retry_after_ignored_when_smaller() {
        // Retry 4 backs off [16, 32); RA 5 s changes nothing.
        assert_range(16.0, 32.0, |next| decide(4, 1000, Some(5), next));
        assert_range(2.0, 4.0, |next| decide(1, 1000, Some(0), next));
    }

    #[test]
    fn retry_after_oversized_clamped_not_terminal() {
        // RA 30 s with 5 s left: backoff [2, 4), clamped = min(30, 2.5) = 2.5 → [2.5, 3.125); the
        // larger of the two lies in [2.5, 4), inside Go's bound of [2.5, 5). Never terminal.
        assert_range(2.5, 4.0, |next| decide(1, 5, Some(30), next));
    }

    #[test]
    fn retry_after_clamped_to_half_deadline() {
        // RA 100 s with 40 s left: clamped = 20 → [20, 25).
        assert_range(20.0, 25.0, |next| decide(1, 40, Some(100), next));
        // Never beyond 0.625 × s.
        let mut rng = StdRng::seed_from_u64(3);
        for s in 1..200 {
            for n in 1..8 {
                if let RetryDecision::Backoff(d) =
                    retry_decision(n, s, Some(Duration::from_secs(1_000_000)), &mut rng)
                {
                    assert!(secs(d) < s as f64, "n={n} s={s} backoff {d:?}");
                }
            }
        }
    }

    #[test]
    fn rate_limit_with_retry_after_header_backs_off_at_least_25() {
        // Go's RateLimitRequest_WithRetryAfterHeader: RA 30 s, far deadline → backoff ≥ 25.
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..100 {
            match retry_decision(1, 3600, Some(Duration::from_secs(30)), &mut rng) {
                RetryDecision::Backoff(d) => assert!(secs(d) >= 25.0),
                RetryDecision::DeadlineExceeded => panic!(),
            }
        }
    }

    #[test]
    fn parse_retry_after_cases() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let at = |offset: i64| {
            let t = if offset >= 0 {
                now + Duration::from_secs(offset.unsigned_abs())
            } else {
                now - Duration::from_secs(offset.unsigned_abs())
            };
            httpdate::fmt_http_date(t)
        };
        assert_eq!(parse_retry_after("", now), None);
        assert_eq!(parse_retry_after("0", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("30", now), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("+7", now), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("-1", now), None);
        assert_eq!(parse_retry_after("1.5", now), None);
        assert_eq!(parse_retry_after(" 30", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("99999999999999999999", now), None);
        assert_eq!(
            parse_retry_after(&at(120), now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(&at(-120), now), Some(Duration::ZERO));
        // RFC 850 and asctime forms are HTTP-dates too.
        assert_eq!(
            parse_retry_after("Tuesday, 14-Nov-23 22:15:20 GMT", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Tue Nov 14 22:15:20 2023", now),
            Some(Duration::from_secs(120))
        );
    }
}
