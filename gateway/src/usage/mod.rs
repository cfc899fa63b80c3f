//! Usage records and budgets.
//!
//! Every authenticated API request leaves one [`Record`] (tenant, key id, model, endpoint, HTTP
//! status — 499 when the client left first —, prompt / cached / completion tokens, time to first
//! token, end-to-end time, the upstream it ran on, and its cost under the config's prices). The
//! request path only hands the record to a channel; one writer thread owns the database
//! connection and writes records in batches ([`MAX_BATCH`] records, or what came within
//! [`BATCH_WINDOW`] of a batch's first), one transaction each — so a crash loses at most the
//! batch being gathered.
//!
//! `GET /v1/usage` reads the daily rollup (`store`) on connections of its own, never the
//! writer's: each read first has the writer write what it holds (so a tenant sees every request
//! that ended before it asked), a tenant has one read in flight at a time (another gets 429),
//! at most [`READERS`] run at once, and each is stopped at [`READ_DEADLINE`] (503).
//!
//! Two stores, one schema ([`SCHEMA`]): SQLite (embedded, WAL journal; the default) and
//! PostgreSQL (`postgres://…`).
//!
//! Budgets: a tenant's spend in its budget period (a UTC day or month) is kept in memory —
//! loaded from the store at start-up, added to as records are made — and checked when a request
//! is admitted; a request over budget is refused (429 `budget_exceeded`) before any work, and a
//! request admitted runs to its end whatever it costs: a stream is never cut mid-answer.

mod store;

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::db::DbError;
pub use store::{Store, SCHEMA};

/// Most records written in one transaction.
pub const MAX_BATCH: usize = 256;
/// How long the writer gathers a batch after its first record.
pub const BATCH_WINDOW: Duration = Duration::from_millis(100);
/// Records that may wait for the writer; beyond, new ones are dropped (and counted) rather than
/// slow the request path.
const QUEUE: usize = 65_536;
/// Usage reads running at once (each on a connection of its own).
pub const READERS: usize = 2;
/// Longest a usage read may take, waiting for its turn included.
pub const READ_DEADLINE: Duration = Duration::from_secs(5);

/// Why a usage read was not answered.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("a usage read of this tenant is already running; retry when it ends")]
    Busy,
    #[error("the usage read did not finish within {0:?}; retry later or ask for fewer days")]
    TimedOut(Duration),
    #[error("usage store: {0}")]
    Store(#[from] DbError),
}

/// One request's usage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// When the request arrived (Unix milliseconds).
    pub at_ms: i64,
    pub request_id: String,
    pub tenant: String,
    /// The first 12 hex digits of the API key's sha256 (as in the config's `api_key_sha256`).
    pub key_id: String,
    pub model: String,
    /// `/v1/chat/completions`, `/v1/completions`, `/v1/messages` or `/v1/responses`.
    pub endpoint: String,
    /// The HTTP status; 499 when the client left before the response ended.
    pub status: u16,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub ttft_ms: Option<f64>,
    pub e2e_ms: f64,
    /// The upstream that served it (none when refused before routing).
    pub route: Option<String>,
    pub cost_usd: f64,
}

/// A model's prices in USD per million tokens (`[[price]]` in the config).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub model: String,
    pub input_per_mtok: f64,
    /// Prompt tokens read from the prefix cache (default: the input price).
    pub cached_input_per_mtok: Option<f64>,
    pub output_per_mtok: f64,
}

/// A `[[price]]` whose prices are negative or not numbers.
#[derive(Debug, thiserror::Error)]
#[error("price of `{0}`: prices must be finite and not negative (USD per million tokens)")]
pub struct InvalidPrice(pub String);

impl Price {
    pub fn validate(&self) -> Result<(), InvalidPrice> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !(ok(self.input_per_mtok)
            && ok(self.output_per_mtok)
            && self.cached_input_per_mtok.is_none_or(ok))
        {
            return Err(InvalidPrice(self.model.clone()));
        }
        Ok(())
    }

    /// The cost of a request's tokens.
    pub fn cost(&self, prompt: u64, cached: u64, completion: u64) -> f64 {
        let cached = cached.min(prompt);
        ((prompt - cached) as f64 * self.input_per_mtok
            + cached as f64 * self.cached_input_per_mtok.unwrap_or(self.input_per_mtok)
            + completion as f64 * self.output_per_mtok)
            / 1e6
    }
}

/// A budget's period: calendar days or months, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    Day,
    Month,
}

impl Period {
    /// `day` or `month`.
    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }

    /// The period holding `ms` (Unix milliseconds): its start and end.
    pub fn bounds(self, ms: i64) -> (i64, i64) {
        let day = ms.div_euclid(DAY_MS);
        match self {
            Period::Day => (day * DAY_MS, (day + 1) * DAY_MS),
            Period::Month => {
                let (y, m, _) = civil(day);
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (
                    days_from_civil(y, m, 1) * DAY_MS,
                    days_from_civil(ny, nm, 1) * DAY_MS,
                )
            }
        }
    }
}

const DAY_MS: i64 = 86_400_000;

/// The UTC date (`YYYY-MM-DD`) of Unix milliseconds `ms`.
pub fn day_of(ms: i64) -> String {
    let (y, m, d) = civil(ms.div_euclid(DAY_MS));
    format!("{y:04}-{m:02}-{d:02}")
}

/// Parses a `YYYY-MM-DD` date into the Unix day number.
pub fn parse_day(s: &str) -> Option<i64> {
    let mut it = s.splitn(3, '-');
    let (y, m, d) = (it.next()?, it.next()?, it.next()?);
    if y.len() != 4 || m.len() != 2 || d.len() != 2 {
        return None;
    }
    let (y, m, d): (i64, u32, u32) = (y.parse().ok()?, m.parse().ok()?, d.parse().ok()?);
    let n = days_from_civil(y, m, d);
    (civil(n) == (y, m, d)).then_some(n)
}

/// (year, month, day) of a Unix day number (Howard Hinnant's `civil_from_days`).
fn civil(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The Unix day number of a date (`days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from(if m > 2 { m - 3 } else { m + 9 });
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One row of a usage summary: a day and a model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DayRow {
    pub day: String,
    pub model: String,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
}

enum Msg {
    Record(Box<Record>),
    /// Write what is held, then answer.
    Flush(mpsc::Sender<()>),
}

/// A tenant's spend in the current day and month.
#[derive(Debug, Clone, Copy, Default)]
struct Spend {
    day: (i64, f64),
    month: (i64, f64),
}

/// The usage log: where requests' records go, and the tenants' spend.
pub struct UsageLog {
    tx: SyncSender<Msg>,
    prices: HashMap<String, Price>,
    spend: Mutex<HashMap<String, Spend>>,
    dropped: std::sync::atomic::AtomicU64,
    /// Where the store is, for the readers' connections.
    url: String,
    /// Reader connections not in use (opened as needed, at most [`READERS`]).
    readers: Mutex<Vec<Store>>,
    read_turns: std::sync::Arc<tokio::sync::Semaphore>,
    /// Tenants with a read in flight.
    reading: Mutex<std::collections::HashSet<String>>,
}

impl std::fmt::Debug for UsageLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageLog").finish_non_exhaustive()
    }
}

impl UsageLog {
    /// Opens the store at `url` (`sqlite:PATH` or `postgres://…`), creates the schema, loads
    /// this day's and month's spend per tenant, and starts the writer thread.
    pub fn open(url: &str, prices: Vec<Price>) -> Result<UsageLog, DbError> {
        let mut store = Store::open(url)?;
        let now = now_ms();
        let (day0, _) = Period::Day.bounds(now);
        let (month0, _) = Period::Month.bounds(now);
        let mut spend: HashMap<String, Spend> = HashMap::new();
        for (tenant, usd) in store.spent_since(day0)? {
            spend.entry(tenant).or_default().day = (day0, usd);
        }
        for (tenant, usd) in store.spent_since(month0)? {
            spend.entry(tenant).or_default().month = (month0, usd);
        }
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("cachet-usage".into())
            .spawn(move || writer(store, rx))
            .map_err(|e| DbError(format!("starting the usage writer: {e}")))?;
        Ok(UsageLog {
            tx,
            prices: prices.into_iter().map(|p| (p.model.clone(), p)).collect(),
            spend: Mutex::new(spend),
            dropped: Default::default(),
            url: url.to_string(),
            readers: Mutex::new(Vec::new()),
            read_turns: std::sync::Arc::new(tokio::sync::Semaphore::new(READERS)),
            reading: Default::default(),
        })
    }

    /// The price of `model`, if the config sets one.
    pub fn price(&self, model: &str) -> Option<&Price> {
        self.prices.get(model)
    }

    /// Records a request: prices it, adds it to its tenant's spend, and queues it for the
    /// writer (never blocking: a full queue drops the record, counted in [`Self::dropped`]).
    pub fn record(&self, mut r: Record) {
        r.cost_usd = self.price(&r.model).map_or(0.0, |p| {
            p.cost(r.prompt_tokens, r.cached_tokens, r.completion_tokens)
        });
        if r.cost_usd > 0.0 {
            let mut spend = self.spend.lock().expect("spend lock");
            let s = spend.entry(r.tenant.clone()).or_default();
            // Spend counts in the period the request arrived in.
            for (period, slot) in [(Period::Day, &mut s.day), (Period::Month, &mut s.month)] {
                let (start, _) = period.bounds(r.at_ms);
                if start > slot.0 {
                    *slot = (start, 0.0);
                }
                if start == slot.0 {
                    slot.1 += r.cost_usd;
                }
            }
        }
        match self.tx.try_send(Msg::Record(Box::new(r))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                let n = self
                    .dropped
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n.is_power_of_two() {
                    tracing::error!(
                        dropped = n + 1,
                        "usage records dropped: the store does not keep up"
                    );
                }
            }
        }
    }

    /// Writes every record made so far and waits for it (at most 10 s): a clean stop loses
    /// nothing.
    pub fn flush(&self) {
        let (tx, rx) = mpsc::channel();
        if self.tx.send(Msg::Flush(tx)).is_ok() {
            let _ = rx.recv_timeout(Duration::from_secs(10));
        }
    }

    /// Records dropped because the writer could not keep up.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A tenant's spend in the `period` holding now.
    pub fn spent(&self, tenant: &str, period: Period) -> f64 {
        let (start, _) = period.bounds(now_ms());
        let spend = self.spend.lock().expect("spend lock");
        spend.get(tenant).map_or(0.0, |s| {
            let slot = match period {
                Period::Day => s.day,
                Period::Month => s.month,
            };
            if slot.0 == start {
                slot.1
            } else {
                0.0
            }
        })
    }

    /// A tenant's usage for days `from..=to` (`YYYY-MM-DD`), by day and model, including every
    /// record made before the call: one read of the tenant at a time, [`READERS`] at once,
    /// within [`READ_DEADLINE`].
    pub async fn summary(
        &self,
        tenant: &str,
        from_day: &str,
        to_day: &str,
    ) -> Result<Vec<DayRow>, ReadError> {
        let _turn = TenantRead::begin(&self.reading, tenant).ok_or(ReadError::Busy)?;
        let deadline = Instant::now() + READ_DEADLINE;
        let _permit = tokio::time::timeout_at(deadline.into(), self.read_turns.acquire())
            .await
            .map_err(|_| ReadError::TimedOut(READ_DEADLINE))?
            .map_err(|_| DbError("the usage readers stopped".into()))?;
        let taken = self.readers.lock().expect("readers lock").pop();
        let (url, tx) = (self.url.clone(), self.tx.clone());
        let (tenant, from_day, to_day) =
            (tenant.to_string(), from_day.to_string(), to_day.to_string());
        let (store, rows) = tokio::task::spawn_blocking(move || {
            // What the writer holds goes in first.
            let (done, wait) = mpsc::channel();
            if tx.send(Msg::Flush(done)).is_ok() {
                let _ = wait.recv_timeout(deadline.saturating_duration_since(Instant::now()));
            }
            let mut store = match taken {
                Some(s) => s,
                None => match Store::open_reader(&url) {
                    Ok(s) => s,
                    Err(e) => return (None, Err(e)),
                },
            };
            let rows = store.summary(&tenant, &from_day, &to_day, deadline);
            (Some(store), rows)
        })
        .await
        .map_err(|e| DbError(format!("the usage read failed: {e}")))?;
        if let Some(s) = store {
            self.readers.lock().expect("readers lock").push(s);
        }
        rows.map_err(|e| {
            if Instant::now() >= deadline {
                ReadError::TimedOut(READ_DEADLINE)
            } else {
                ReadError::Store(e)
            }
        })
    }
}

/// A tenant's read in flight; dropping it ends the read.
struct TenantRead<'a> {
    reading: &'a Mutex<std::collections::HashSet<String>>,
    tenant: String,
}

impl<'a> TenantRead<'a> {
    fn begin(reading: &'a Mutex<std::collections::HashSet<String>>, tenant: &str) -> Option<Self> {
        reading
            .lock()
            .expect("reading lock")
            .insert(tenant.to_string())
            .then(|| TenantRead {
                reading,
                tenant: tenant.to_string(),
            })
    }
}

impl Drop for TenantRead<'_> {
    fn drop(&mut self) {
        self.reading
            .lock()
            .expect("reading lock")
            .remove(&self.tenant);
    }
}

/// Budget state of a tenant, for `/v1/usage` and refusals.
#[derive(Debug, Clone, Serialize)]
pub struct BudgetState {
    pub usd: f64,
    pub period: Period,
    pub spent_usd: f64,
    /// When the period ends (Unix seconds).
    pub resets_at: i64,
}

impl UsageLog {
    /// The budget state of a tenant with `budget` USD per `period`.
    pub fn budget(&self, tenant: &str, usd: f64, period: Period) -> BudgetState {
        let (_, end) = period.bounds(now_ms());
        BudgetState {
            usd,
            period,
            spent_usd: self.spent(tenant, period),
            resets_at: end / 1000,
        }
    }
}

/// The writer: gathers records into batches and writes each in one transaction; answers
/// queries after writing what it holds.
fn writer(mut store: Store, rx: Receiver<Msg>) {
    let mut batch: Vec<Record> = Vec::with_capacity(MAX_BATCH);
    let mut first: Option<Instant> = None;
    let flush = |store: &mut Store, batch: &mut Vec<Record>| {
        if batch.is_empty() {
            return;
        }
        if let Err(e) = store.write(batch) {
            tracing::error!(error = %e, records = batch.len(), "writing usage records failed");
        }
        batch.clear();
    };
    loop {
        let msg = match first {
            None => match rx.recv() {
                Ok(m) => m,
                Err(_) => break,
            },
            Some(t) => match rx.recv_timeout(BATCH_WINDOW.saturating_sub(t.elapsed())) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    flush(&mut store, &mut batch);
                    first = None;
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            },
        };
        match msg {
            Msg::Record(r) => {
                batch.push(*r);
                first.get_or_insert_with(Instant::now);
                if batch.len() >= MAX_BATCH {
                    flush(&mut store, &mut batch);
                    first = None;
                }
            }
            Msg::Flush(done) => {
                flush(&mut store, &mut batch);
                first = None;
                let _ = done.send(());
            }
        }
    }
    flush(&mut store, &mut batch);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_periods_follow_the_calendar() {
        assert_eq!(day_of(0), "1970-01-01");
        // 2026-12-01T07:30:00Z
        let ms = 1_796_110_200_000;
        assert_eq!(day_of(ms), "2026-12-01");
        let (s, e) = Period::Month.bounds(ms);
        assert_eq!(
            (day_of(s), day_of(e)),
            ("2026-12-01".into(), "2027-01-01".into())
        );
        let (s, e) = Period::Month.bounds(parse_day("2024-02-29").unwrap() * DAY_MS);
        assert_eq!((e - s) / DAY_MS, 29, "a leap February");
        let (s, e) = Period::Day.bounds(ms);
        assert_eq!((day_of(s), e - s), ("2026-12-01".into(), DAY_MS));
        for bad in ["2026-13-01", "2026-02-30", "26-01-01", "2026-1-01", "x"] {
            assert_eq!(parse_day(bad), None, "{bad}");
        }
        for n in (-700_000..2_900_000).step_by(7) {
            assert_eq!(parse_day(&day_of(n * DAY_MS)), Some(n));
        }
    }

    #[test]
    fn cost_counts_cached_tokens_at_their_price() {
        let p = Price {
            model: "m".into(),
            input_per_mtok: 2.0,
            cached_input_per_mtok: Some(0.5),
            output_per_mtok: 8.0,
        };
        let c = p.cost(1_000_000, 400_000, 500_000);
        assert!((c - (1.2 + 0.2 + 4.0)).abs() < 1e-9, "{c}");
        let bad = Price {
            input_per_mtok: -1.0,
            ..p
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("not negative"));
    }
}
