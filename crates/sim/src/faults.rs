//! Fault injection: turns the configured rates into a decision per request. The server asks
//! twice: [`FaultPlan::rate_limited`] before admission, then [`FaultPlan::draw`] once a request
//! has been admitted to run; each answer is a fresh random draw from the thread-local RNG.

use std::time::Duration;

use rand::Rng;

use super::SimConfig;

/// What happens to a request that has been admitted to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Answer normally after the simulated latency.
    None,
    /// Answer 400 as if the request were invalid.
    BadRequest,
    /// Answer 500 or 503.
    ServerError { unavailable: bool },
    /// Drop the TCP connection without an answer.
    Reset,
    /// Never answer; hold the connection until the client leaves or the simulator stops.
    Hang,
}

/// The rates of the injected faults, apart from latency: what `GET /faults` shows and
/// `POST /faults` replaces while the simulator runs. A field left out of a posted body is 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultRates {
    /// `--error-rate`: 500 or 503.
    pub error_rate: f64,
    /// `--rate-limit-rate`: 429 before admission.
    pub rate_limit_rate: f64,
    /// `--hang-rate`: no answer until the client gives up.
    pub hang_rate: f64,
    /// `--reset-rate`: the connection is reset.
    pub reset_rate: f64,
    /// `--bad-request-rate`: 400.
    pub bad_request_rate: f64,
    /// `--slow-rate`: an extra `--slow-ms` of latency.
    pub slow_rate: f64,
}

impl FaultRates {
    /// `cfg` with these rates in place of its own.
    pub fn apply(&self, cfg: &SimConfig) -> SimConfig {
        SimConfig {
            error_rate: self.error_rate,
            rate_limit_rate: self.rate_limit_rate,
            hang_rate: self.hang_rate,
            reset_rate: self.reset_rate,
            bad_request_rate: self.bad_request_rate,
            slow_rate: self.slow_rate,
            ..cfg.clone()
        }
    }
}

/// The fault rates and latency knobs; replaced as a whole when the rates change at run time.
#[derive(Debug, Clone)]
pub(crate) struct FaultPlan {
    rate_limit: f64,
    bad_request: f64,
    error: f64,
    reset: f64,
    hang: f64,
    slow: f64,
    slow_extra: Duration,
    ttft: Duration,
    per_token_ms: f64,
    jitter: f64,
}

impl FaultPlan {
    /// Takes the rates from a validated config.
    pub(crate) fn new(cfg: &SimConfig) -> Self {
        Self {
            rate_limit: cfg.rate_limit_rate,
            bad_request: cfg.bad_request_rate,
            error: cfg.error_rate,
            reset: cfg.reset_rate,
            hang: cfg.hang_rate,
            slow: cfg.slow_rate,
            slow_extra: Duration::from_millis(cfg.slow_ms),
            ttft: Duration::from_millis(cfg.ttft_ms),
            per_token_ms: cfg.per_token_ms,
            jitter: cfg.jitter,
        }
    }

    /// The rates this plan draws with.
    pub(crate) fn rates(&self) -> FaultRates {
        FaultRates {
            error_rate: self.error,
            rate_limit_rate: self.rate_limit,
            hang_rate: self.hang,
            reset_rate: self.reset,
            bad_request_rate: self.bad_request,
            slow_rate: self.slow,
        }
    }

    /// Whether an arriving request is refused with 429 regardless of capacity.
    pub(crate) fn rate_limited(&self) -> bool {
        chance(self.rate_limit)
    }

    /// The fate of an admitted request. One uniform draw is split into consecutive bands, so
    /// each configured rate is exactly that fault's probability.
    pub(crate) fn draw(&self) -> Fault {
        if self.bad_request + self.error + self.reset + self.hang <= 0.0 {
            return Fault::None;
        }
        let mut rng = rand::rng();
        let roll: f64 = rng.random();
        let mut edge = self.bad_request;
        if roll < edge {
            return Fault::BadRequest;
        }
        edge += self.error;
        if roll < edge {
            return Fault::ServerError {
                unavailable: rng.random(),
            };
        }
        edge += self.reset;
        if roll < edge {
            return Fault::Reset;
        }
        edge += self.hang;
        if roll < edge {
            return Fault::Hang;
        }
        Fault::None
    }

    /// How long a successful request producing `tokens` output tokens takes: time to first
    /// token plus decode time, spread by jitter, plus the slow-fault delay when it fires.
    /// The flag says whether the slow fault fired.
    pub(crate) fn latency(&self, tokens: u64) -> (Duration, bool) {
        // Work in nanoseconds; float-to-int casts saturate, so huge knobs cannot overflow.
        let decode_ns = (self.per_token_ms * tokens as f64 * 1e6).round();
        let mut nominal_ns = self.ttft.as_nanos() as f64 + decode_ns;
        if self.jitter > 0.0 && nominal_ns > 0.0 {
            let spread: f64 = rand::rng().random_range(-self.jitter..=self.jitter);
            nominal_ns *= 1.0 + spread;
        }
        let mut total = Duration::from_nanos(nominal_ns.round() as u64);
        let slow = chance(self.slow);
        if slow {
            total = total.saturating_add(self.slow_extra);
        }
        (total, slow)
    }
}

/// True with probability `p`; no RNG call when the rate is zero (the common, fast case).
fn chance(p: f64) -> bool {
    if p <= 0.0 {
        false
    } else if p >= 1.0 {
        true
    } else {
        rand::rng().random::<f64>() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(cfg: SimConfig) -> FaultPlan {
        FaultPlan::new(&cfg)
    }

    #[test]
    fn rate_one_always_fires_and_zero_never() {
        let base = SimConfig::instant();
        let cases = [
            (
                SimConfig {
                    bad_request_rate: 1.0,
                    ..base.clone()
                },
                "bad",
            ),
            (
                SimConfig {
                    error_rate: 1.0,
                    ..base.clone()
                },
                "error",
            ),
            (
                SimConfig {
                    reset_rate: 1.0,
                    ..base.clone()
                },
                "reset",
            ),
            (
                SimConfig {
                    hang_rate: 1.0,
                    ..base.clone()
                },
                "hang",
            ),
            (base.clone(), "none"),
        ];
        for (cfg, want) in cases {
            let p = plan(cfg);
            for _ in 0..200 {
                let got = match p.draw() {
                    Fault::None => "none",
                    Fault::BadRequest => "bad",
                    Fault::ServerError { .. } => "error",
                    Fault::Reset => "reset",
                    Fault::Hang => "hang",
                };
                assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn split_rates_are_roughly_honoured() {
        let p = plan(SimConfig {
            error_rate: 0.5,
            reset_rate: 0.5,
            ..SimConfig::instant()
        });
        let draws = 4000;
        let errors = (0..draws)
            .filter(|_| matches!(p.draw(), Fault::ServerError { .. }))
            .count();
        // Binomial(4000, 0.5): standard deviation ~32, so ±400 never fails by chance.
        assert!((1600..=2400).contains(&errors), "errors = {errors}");
    }

    #[test]
    fn latency_adds_ttft_decode_and_slow() {
        let p = plan(SimConfig {
            ttft_ms: 10,
            per_token_ms: 2.0,
            slow_rate: 1.0,
            slow_ms: 100,
            ..SimConfig::default()
        });
        assert_eq!(p.latency(5), (Duration::from_millis(120), true));
        let jittery = plan(SimConfig {
            ttft_ms: 100,
            per_token_ms: 0.0,
            jitter: 0.5,
            ..SimConfig::default()
        });
        for _ in 0..100 {
            let (d, slow) = jittery.latency(1);
            assert!(!slow);
            assert!(d >= Duration::from_millis(49) && d <= Duration::from_millis(151));
        }
    }
}
