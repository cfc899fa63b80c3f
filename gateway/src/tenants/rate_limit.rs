//! A token bucket: `per_minute` units a minute, bursting up to one minute's worth; and what a
//! response reports of a tenant's buckets (OpenAI's `x-ratelimit-*` headers).
//!
//! O(1) per call; time is passed in, so tests need no clock.

use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct TokenBucket {
    capacity: f64,
    /// Units per second.
    rate: f64,
    level: f64,
    at: Instant,
}

/// Why a take was refused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Refusal {
    /// Wait this long, then retry.
    RetryAfter(Duration),
    /// More than the bucket can ever hold: retrying cannot help.
    TooLarge { asked: f64, capacity: f64 },
}

impl TokenBucket {
    /// A full bucket.
    pub fn per_minute(per_minute: u64, now: Instant) -> Self {
        let capacity = per_minute as f64;
        TokenBucket {
            capacity,
            rate: capacity / 60.0,
            level: capacity,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + dt * self.rate).min(self.capacity);
        self.at = now;
    }

    /// Whether `n` units are there now, without taking them.
    pub fn check(&mut self, n: f64, now: Instant) -> Result<(), Refusal> {
        if n > self.capacity {
            return Err(Refusal::TooLarge {
                asked: n,
                capacity: self.capacity,
            });
        }
        self.refill(now);
        if self.level >= n {
            return Ok(());
        }
        Err(Refusal::RetryAfter(Duration::from_secs_f64(
            (n - self.level) / self.rate,
        )))
    }

    /// Takes `n` units if they are there.
    pub fn try_take(&mut self, n: f64, now: Instant) -> Result<(), Refusal> {
        self.check(n, now)?;
        self.level -= n;
        Ok(())
    }

    /// Takes `n` units unconditionally (usage measured after the fact); the level may go negative,
    /// which delays later requests.
    pub fn charge(&mut self, n: f64, now: Instant) {
        self.refill(now);
        self.level -= n;
    }

    /// Gives `n` units back (a take whose request was refused later on).
    pub fn refund(&mut self, n: f64, now: Instant) {
        self.refill(now);
        self.level = (self.level + n).min(self.capacity);
    }

    /// The same bucket at a new rate (a config reload): its level kept, within the new capacity.
    pub fn rescaled(&mut self, per_minute: u64, now: Instant) -> TokenBucket {
        self.refill(now);
        let mut b = TokenBucket::per_minute(per_minute, now);
        b.level = self.level.min(b.capacity);
        b
    }

    pub fn level(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.level
    }

    /// The bucket as a response reports it now.
    pub fn state(&mut self, now: Instant) -> LimitState {
        self.refill(now);
        LimitState::of(self.capacity, self.level)
    }
}

/// One bucket as OpenAI's `x-ratelimit-*` headers report it: its size (a minute's worth), the
/// whole units left, and how long until it is full again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitState {
    pub limit: u64,
    pub remaining: u64,
    pub reset: Duration,
}

impl LimitState {
    /// A bucket of `per_minute` units holding `level` (negative: in debt).
    pub fn of(per_minute: f64, level: f64) -> Self {
        let missing = (per_minute - level).max(0.0);
        LimitState {
            limit: per_minute as u64,
            remaining: level.clamp(0.0, per_minute).floor() as u64,
            reset: Duration::from_secs_f64(missing * 60.0 / per_minute.max(1.0)),
        }
    }
}

/// A tenant's requests/min and tokens/min buckets as a response reports them (each `None` where
/// the tenant has no such limit, or where its level is not known here).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RateLimits {
    pub requests: Option<LimitState>,
    pub tokens: Option<LimitState>,
}

impl RateLimits {
    /// OpenAI's headers: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, each reset a
    /// Go duration as OpenAI writes them (`20ms`, `1.5s`, `6m0s`).
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = Vec::new();
        for (state, names) in [
            (
                self.requests,
                [
                    "x-ratelimit-limit-requests",
                    "x-ratelimit-remaining-requests",
                    "x-ratelimit-reset-requests",
                ],
            ),
            (
                self.tokens,
                [
                    "x-ratelimit-limit-tokens",
                    "x-ratelimit-remaining-tokens",
                    "x-ratelimit-reset-tokens",
                ],
            ),
        ] {
            if let Some(s) = state {
                h.push((names[0], s.limit.to_string()));
                h.push((names[1], s.remaining.to_string()));
                h.push((names[2], go_duration(s.reset)));
            }
        }
        h
    }
}

/// `d` to the millisecond as Go's `time.Duration` prints it: `0s`, `20ms`, `1.5s`, `6m0s`,
/// `1h2m3.25s`.
pub fn go_duration(d: Duration) -> String {
    let ms = (d.as_secs_f64() * 1000.0).round() as u64;
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m, s_ms) = (ms / 3_600_000, ms / 60_000 % 60, ms % 60_000);
    let mut secs = format!("{}.{:03}", s_ms / 1000, s_ms % 1000);
    while secs.ends_with('0') {
        secs.pop();
    }
    if secs.ends_with('.') {
        secs.pop();
    }
    match (h, m) {
        (0, 0) => format!("{secs}s"),
        (0, m) => format!("{m}m{secs}s"),
        (h, m) => format!("{h}h{m}m{secs}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refills_at_the_per_minute_rate_and_says_when_to_retry() {
        let t0 = Instant::now();
        let mut b = TokenBucket::per_minute(60, t0);
        assert!(b.try_take(60.0, t0).is_ok());
        assert_eq!(
            b.try_take(1.0, t0),
            Err(Refusal::RetryAfter(Duration::from_secs(1)))
        );
        let t1 = t0 + Duration::from_secs(10);
        assert!(b.try_take(10.0, t1).is_ok());
        assert_eq!(
            b.try_take(3.0, t1),
            Err(Refusal::RetryAfter(Duration::from_secs(3)))
        );
        // Never beyond one minute's worth.
        let t2 = t1 + Duration::from_secs(3600);
        assert_eq!(b.level(t2), 60.0);
        assert!(matches!(
            b.try_take(61.0, t2),
            Err(Refusal::TooLarge { .. })
        ));
    }

    #[test]
    fn a_bucket_reports_what_is_left_and_when_it_is_full_again() {
        let t0 = Instant::now();
        let mut b = TokenBucket::per_minute(600, t0);
        assert_eq!(
            b.state(t0),
            LimitState {
                limit: 600,
                remaining: 600,
                reset: Duration::ZERO
            }
        );
        b.charge(750.5, t0);
        // 150.5 in debt: none left, full again in 750.5 / 10 per second.
        let s = b.state(t0);
        assert_eq!((s.limit, s.remaining), (600, 0));
        assert_eq!(go_duration(s.reset), "1m15.05s");
        let h = RateLimits {
            requests: Some(LimitState::of(60.0, 59.0)),
            tokens: None,
        }
        .headers();
        assert_eq!(
            h,
            [
                ("x-ratelimit-limit-requests", "60".to_string()),
                ("x-ratelimit-remaining-requests", "59".to_string()),
                ("x-ratelimit-reset-requests", "1s".to_string()),
            ]
        );
    }

    #[test]
    fn durations_are_written_as_go_writes_them() {
        let ms = Duration::from_millis;
        for (d, s) in [
            (ms(0), "0s"),
            (Duration::from_micros(400), "0s"),
            (ms(20), "20ms"),
            (ms(1000), "1s"),
            (ms(1500), "1.5s"),
            (ms(360_000), "6m0s"),
            (ms(3_723_250), "1h2m3.25s"),
        ] {
            assert_eq!(go_duration(d), s, "{d:?}");
        }
    }

    #[test]
    fn charging_usage_can_go_into_debt() {
        let t0 = Instant::now();
        let mut b = TokenBucket::per_minute(600, t0);
        b.charge(900.0, t0);
        assert_eq!(b.level(t0), -300.0);
        assert_eq!(
            b.try_take(10.0, t0),
            Err(Refusal::RetryAfter(Duration::from_secs(31)))
        );
    }
}
