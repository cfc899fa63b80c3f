//! The usage stores: SQLite (embedded) and PostgreSQL, one schema and the same statements.

use super::{day_of, DayRow, Record};

/// The table and index, as both stores create them.
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
CREATE INDEX IF NOT EXISTS usage_records_at ON usage_records (at_ms);";

const INSERT: &str = "INSERT INTO usage_records (at_ms, day, request_id, tenant, key_id, model, \
    endpoint, status, prompt_tokens, cached_tokens, completion_tokens, ttft_ms, e2e_ms, route, \
    cost_usd) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";

// The casts: PostgreSQL sums BIGINTs as NUMERIC.
const SUMMARY: &str = "SELECT day, model, COUNT(*), CAST(SUM(prompt_tokens) AS BIGINT), \
    CAST(SUM(cached_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT), SUM(cost_usd) \
    FROM usage_records \
    WHERE tenant = $1 AND day >= $2 AND day <= $3 GROUP BY day, model ORDER BY day, model";

const SPENT: &str =
    "SELECT tenant, SUM(cost_usd) FROM usage_records WHERE at_ms >= $1 GROUP BY tenant";

/// A store failure, with what failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("usage store: {0}")]
pub struct StoreError(pub String);

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError(e.to_string())
    }
}

impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> Self {
        StoreError(e.to_string())
    }
}

/// An open store.
pub enum Store {
    Sqlite(rusqlite::Connection),
    Postgres(Box<postgres::Client>),
}

impl Store {
    /// Opens `sqlite:PATH` (created if missing; WAL journal) or `postgres://…` / `postgresql://…`
    /// and creates the schema.
    pub fn open(url: &str) -> Result<Store, StoreError> {
        if let Some(path) = url.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(StoreError(
                    "`sqlite:` needs a file path, e.g. sqlite:usage.db".into(),
                ));
            }
            let c = rusqlite::Connection::open(path)
                .map_err(|e| StoreError(format!("opening {path}: {e}")))?;
            // WAL: readers never block the writer; `synchronous = NORMAL` syncs at checkpoints,
            // so a process crash loses nothing committed (a power cut may lose the last
            // transactions).
            c.pragma_update(None, "journal_mode", "WAL")?;
            c.pragma_update(None, "synchronous", "NORMAL")?;
            c.busy_timeout(std::time::Duration::from_secs(5))?;
            c.execute_batch(SCHEMA)?;
            Ok(Store::Sqlite(c))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let mut c = postgres::Client::connect(url, postgres::NoTls)
                .map_err(|e| StoreError(format!("connecting to PostgreSQL: {e}")))?;
            c.batch_execute(SCHEMA)?;
            Ok(Store::Postgres(Box::new(c)))
        } else {
            Err(StoreError(format!(
                "`{url}`: give sqlite:PATH or postgres://USER@HOST/DB"
            )))
        }
    }

    /// Writes `records` in one transaction.
    pub fn write(&mut self, records: &[Record]) -> Result<(), StoreError> {
        match self {
            Store::Sqlite(c) => {
                let tx = c.transaction()?;
                {
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
            Store::Postgres(c) => {
                let mut tx = c.transaction()?;
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

    /// A tenant's usage for days `from..=to`, by day and model.
    pub fn summary(
        &mut self,
        tenant: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<DayRow>, StoreError> {
        match self {
            Store::Sqlite(c) => {
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
            Store::Postgres(c) => {
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

    /// Each tenant's spend since `ms` (Unix milliseconds).
    pub fn spent_since(&mut self, ms: i64) -> Result<Vec<(String, f64)>, StoreError> {
        match self {
            Store::Sqlite(c) => {
                let mut st = c.prepare_cached(SPENT)?;
                let rows = st.query_map([ms], |r| Ok((r.get(0)?, r.get(1)?)))?;
                Ok(rows.collect::<Result<_, _>>()?)
            }
            Store::Postgres(c) => Ok(c
                .query(SPENT, &[&ms])?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect()),
        }
    }

    /// Records in the store.
    pub fn count(&mut self) -> Result<u64, StoreError> {
        let q = "SELECT COUNT(*) FROM usage_records";
        Ok(match self {
            Store::Sqlite(c) => c.query_row(q, [], |r| r.get::<_, i64>(0))? as u64,
            Store::Postgres(c) => c.query_one(q, &[])?.get::<_, i64>(0) as u64,
        })
    }
}
