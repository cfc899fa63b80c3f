//! The usage stores: SQLite (embedded) and PostgreSQL, one schema and the same statements.
//!
//! Beside the records, a daily rollup (`usage_daily`: one row per tenant, day and model, kept
//! in the same transaction as the records it counts) answers the reads: a year's summary for a
//! tenant reads at most 366 × models rows, whatever the traffic (with two million records, the
//! GROUP BY over the records took 4.5 s). A database written before the rollup existed is
//! rolled up once when it is opened.

use std::collections::HashMap;

use super::{day_of, DayRow, Record};
use crate::db::{Conn, DbError};

/// The tables and indexes, as both stores create them.
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS usage_records (
    at_ms BIGINT NOT NULL,
    day TEXT NOT NULL,
    request_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    status INTEGER NOT NULL,
    prompt_tokens BIGINT NOT NULL,
    cached_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    ttft_ms DOUBLE PRECISION,
    e2e_ms DOUBLE PRECISION NOT NULL,
    route TEXT,
    cost_usd DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_records_tenant_day ON usage_records (tenant, day);
CREATE INDEX IF NOT EXISTS usage_records_at ON usage_records (at_ms);
CREATE TABLE IF NOT EXISTS usage_daily (
    tenant TEXT NOT NULL,
    day TEXT NOT NULL,
    model TEXT NOT NULL,
    requests BIGINT NOT NULL,
    prompt_tokens BIGINT NOT NULL,
    cached_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, day, model)
);";

/// Adds a batch's sums to their rollup rows (SQLite and PostgreSQL both take this form).
const ROLL_UP: &str = "INSERT INTO usage_daily (tenant, day, model, requests, prompt_tokens, \
    cached_tokens, completion_tokens, cost_usd) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
    ON CONFLICT (tenant, day, model) DO UPDATE SET \
    requests = usage_daily.requests + excluded.requests, \
    prompt_tokens = usage_daily.prompt_tokens + excluded.prompt_tokens, \
    cached_tokens = usage_daily.cached_tokens + excluded.cached_tokens, \
    completion_tokens = usage_daily.completion_tokens + excluded.completion_tokens, \
    cost_usd = usage_daily.cost_usd + excluded.cost_usd";

/// Rolls up the records of a database written before the rollup existed (run when the rollup
/// is empty; the casts: PostgreSQL sums BIGINTs as NUMERIC).
const BACKFILL: &str = "INSERT INTO usage_daily (tenant, day, model, requests, prompt_tokens, \
    cached_tokens, completion_tokens, cost_usd) \
    SELECT tenant, day, model, COUNT(*), CAST(SUM(prompt_tokens) AS BIGINT), \
    CAST(SUM(cached_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT), SUM(cost_usd) \
    FROM usage_records GROUP BY tenant, day, model";

const INSERT: &str = "INSERT INTO usage_records (at_ms, day, request_id, tenant, key_id, model, \
    endpoint, status, prompt_tokens, cached_tokens, completion_tokens, ttft_ms, e2e_ms, route, \
    cost_usd) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";

const SUMMARY: &str = "SELECT day, model, requests, prompt_tokens, cached_tokens, \
    completion_tokens, cost_usd FROM usage_daily \
    WHERE tenant = $1 AND day >= $2 AND day <= $3 ORDER BY day, model";

const SPENT: &str = "SELECT tenant, SUM(cost_usd) FROM usage_daily WHERE day >= $1 GROUP BY tenant";

/// An open store: a connection of [`crate::db`].
pub struct Store(Conn);

impl Store {
    /// Opens the store at `url` ([`Conn::open`]: `sqlite:PATH` or a PostgreSQL URL, TLS as its
    /// `sslmode` says), creates the schema and, on its first start, fills the daily rollup.
    pub fn open(url: &str) -> Result<Store, DbError> {
        let mut conn = Conn::open(url)?;
        match &mut conn {
            Conn::Sqlite(c) => {
                // WAL: readers never block the writer; `synchronous = NORMAL` syncs at
                // checkpoints, so a process crash loses nothing committed (a power cut may lose
                // the last transactions).
                c.pragma_update(None, "synchronous", "NORMAL")?;
                c.execute_batch(SCHEMA)?;
                // One writer at a time (IMMEDIATE): no other process rolls up meanwhile.
                c.execute_batch("BEGIN IMMEDIATE")?;
                let empty: i64 =
                    c.query_row("SELECT COUNT(*) FROM usage_daily", [], |r| r.get(0))?;
                if empty == 0 {
                    c.execute_batch(BACKFILL)?;
                }
                c.execute_batch("COMMIT")?;
            }
            Conn::Postgres(c) => {
                c.batch_execute(SCHEMA)?;
                // Replicas starting together: one rolls up, the others find it done.
                let mut tx = c.transaction()?;
                tx.batch_execute("LOCK TABLE usage_daily IN SHARE ROW EXCLUSIVE MODE")?;
                let n: i64 = tx
                    .query_one("SELECT COUNT(*) FROM usage_daily", &[])?
                    .get(0);
                if n == 0 {
                    tx.batch_execute(BACKFILL)?;
                }
                tx.commit()?;
            }
        }
        Ok(Store(conn))
    }

    /// Another connection to the store at `url`, for reads ([`Conn::open_reader`]): each of its
    /// statements is stopped at the deadline given with it ([`Store::summary`]).
    pub fn open_reader(url: &str) -> Result<Store, DbError> {
        let mut conn = Conn::open_reader(url)?;
        if let Conn::Postgres(c) = &mut conn {
            c.batch_execute(&format!(
                "SET statement_timeout = {}",
                super::READ_DEADLINE.as_millis()
            ))?;
        }
        Ok(Store(conn))
    }

    /// Writes `records` in one transaction, with their sums added to the daily rollup.
    pub fn write(&mut self, records: &[Record]) -> Result<(), DbError> {
        let sums = daily_sums(records);
        match &mut self.0 {
            Conn::Sqlite(c) => {
                let tx = c.transaction()?;
                {
                    let mut up = tx.prepare_cached(ROLL_UP)?;
                    for ((tenant, day, model), d) in &sums {
                        up.execute(rusqlite::params![
                            tenant,
                            day,
                            model,
                            d.requests as i64,
                            d.prompt_tokens as i64,
                            d.cached_tokens as i64,
                            d.completion_tokens as i64,
                            d.cost_usd,
                        ])?;
                    }
                    let mut st = tx.prepare_cached(INSERT)?;
                    for r in records {
                        st.execute(rusqlite::params![
                            r.at_ms,
                            day_of(r.at_ms),
                            r.request_id,
                            r.tenant,
                            r.key_id,
                            r.model,
                            r.endpoint,
                            r.status,
                            r.prompt_tokens as i64,
                            r.cached_tokens as i64,
                            r.completion_tokens as i64,
                            r.ttft_ms,
                            r.e2e_ms,
                            r.route,
                            r.cost_usd,
                        ])?;
                    }
                }
                tx.commit()?;
            }
            Conn::Postgres(c) => {
                let mut tx = c.transaction()?;
                let up = tx.prepare(ROLL_UP)?;
                for ((tenant, day, model), d) in &sums {
                    tx.execute(
                        &up,
                        &[
                            tenant,
                            day,
                            model,
                            &(d.requests as i64),
                            &(d.prompt_tokens as i64),
                            &(d.cached_tokens as i64),
                            &(d.completion_tokens as i64),
                            &d.cost_usd,
                        ],
                    )?;
                }
                let st = tx.prepare(INSERT)?;
                for r in records {
                    tx.execute(
                        &st,
                        &[
                            &r.at_ms,
                            &day_of(r.at_ms),
                            &r.request_id,
                            &r.tenant,
                            &r.key_id,
                            &r.model,
                            &r.endpoint,
                            &i32::from(r.status),
                            &(r.prompt_tokens as i64),
                            &(r.cached_tokens as i64),
                            &(r.completion_tokens as i64),
                            &r.ttft_ms,
                            &r.e2e_ms,
                            &r.route,
                            &r.cost_usd,
                        ],
                    )?;
                }
                tx.commit()?;
            }
        }
        Ok(())
    }

    /// A tenant's usage for days `from..=to`, by day and model, from the rollup; stopped at
    /// `deadline` (SQLite: a progress handler; PostgreSQL: the reader's statement timeout).
    pub fn summary(
        &mut self,
        tenant: &str,
        from: &str,
        to: &str,
        deadline: std::time::Instant,
    ) -> Result<Vec<DayRow>, DbError> {
        match &mut self.0 {
            Conn::Sqlite(c) => {
                c.progress_handler(10_000, Some(move || std::time::Instant::now() > deadline));
                let mut st = c.prepare_cached(SUMMARY)?;
                let rows = st.query_map(rusqlite::params![tenant, from, to], |r| {
                    Ok(DayRow {
                        day: r.get(0)?,
                        model: r.get(1)?,
                        requests: r.get::<_, i64>(2)? as u64,
                        prompt_tokens: r.get::<_, i64>(3)? as u64,
                        cached_tokens: r.get::<_, i64>(4)? as u64,
                        completion_tokens: r.get::<_, i64>(5)? as u64,
                        cost_usd: r.get(6)?,
                    })
                })?;
                Ok(rows.collect::<Result<_, _>>()?)
            }
            Conn::Postgres(c) => {
                let rows = c.query(SUMMARY, &[&tenant, &from, &to])?;
                Ok(rows
                    .iter()
                    .map(|r| DayRow {
                        day: r.get(0),
                        model: r.get(1),
                        requests: r.get::<_, i64>(2) as u64,
                        prompt_tokens: r.get::<_, i64>(3) as u64,
                        cached_tokens: r.get::<_, i64>(4) as u64,
                        completion_tokens: r.get::<_, i64>(5) as u64,
                        cost_usd: r.get(6),
                    })
                    .collect())
            }
        }
    }

    /// Each tenant's spend from the UTC day holding `ms` (Unix milliseconds) on; periods begin
    /// at midnight UTC, so from a period's start this is its spend.
    pub fn spent_since(&mut self, ms: i64) -> Result<Vec<(String, f64)>, DbError> {
        let day = day_of(ms);
        match &mut self.0 {
            Conn::Sqlite(c) => {
                let mut st = c.prepare_cached(SPENT)?;
                let rows = st.query_map([&day], |r| Ok((r.get(0)?, r.get(1)?)))?;
                Ok(rows.collect::<Result<_, _>>()?)
            }
            Conn::Postgres(c) => Ok(c
                .query(SPENT, &[&day])?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect()),
        }
    }

    /// Records in the store.
    pub fn count(&mut self) -> Result<u64, DbError> {
        let q = "SELECT COUNT(*) FROM usage_records";
        Ok(match &mut self.0 {
            Conn::Sqlite(c) => c.query_row(q, [], |r| r.get::<_, i64>(0))? as u64,
            Conn::Postgres(c) => c.query_one(q, &[])?.get::<_, i64>(0) as u64,
        })
    }
}

/// A batch's sums by tenant, day and model.
fn daily_sums(records: &[Record]) -> HashMap<(String, String, String), DayRow> {
    let mut sums: HashMap<(String, String, String), DayRow> = HashMap::new();
    for r in records {
        let day = day_of(r.at_ms);
        let d = sums
            .entry((r.tenant.clone(), day.clone(), r.model.clone()))
            .or_insert_with(|| DayRow {
                day,
                model: r.model.clone(),
                ..Default::default()
            });
        d.requests += 1;
        d.prompt_tokens += r.prompt_tokens;
        d.cached_tokens += r.cached_tokens;
        d.completion_tokens += r.completion_tokens;
        d.cost_usd += r.cost_usd;
    }
    sums
}
