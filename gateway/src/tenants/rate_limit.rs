//! A token bucket: `per_minute` units a minute, bursting up to one minute's worth.
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
