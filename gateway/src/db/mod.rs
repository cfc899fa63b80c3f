//! The gateway's one database layer, for the operator store and the usage records: SQLite
//! (embedded, one node) or PostgreSQL (every replica; TLS as its URL's `sslmode` says,
//! [`postgres`]), the same statements on both through a few typed values.

use std::time::Duration;

pub mod postgres;

/// A statement's parameter or a column's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    /// A BIGINT column's NULL.
    Null,
    I64(i64),
    Text(String),
}

impl Val {
    pub fn i64(&self) -> Option<i64> {
        match self {
            Val::I64(v) => Some(*v),
            _ => None,
        }
    }

    pub fn text(&self) -> &str {
        match self {
            Val::Text(t) => t,
            _ => "",
        }
    }
}

impl From<i64> for Val {
    fn from(v: i64) -> Self {
        Val::I64(v)
    }
}

impl From<&str> for Val {
    fn from(v: &str) -> Self {
        Val::Text(v.to_string())
    }
}

impl From<String> for Val {
    fn from(v: String) -> Self {
        Val::Text(v)
    }
}

impl From<Option<i64>> for Val {
    fn from(v: Option<i64>) -> Self {
        v.map_or(Val::Null, Val::I64)
    }
}

/// A store failure, with what failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct DbError(pub String);

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        DbError(crate::error::with_causes(&e))
    }
}

impl From<::postgres::Error> for DbError {
    fn from(e: ::postgres::Error) -> Self {
        DbError(crate::error::with_causes(&e))
    }
}

/// An open connection.
pub enum Conn {
    Sqlite(rusqlite::Connection),
    Postgres(Box<::postgres::Client>),
}

/// A transaction on either store.
pub enum Tx<'a> {
    Sqlite(rusqlite::Transaction<'a>),
    Postgres(::postgres::Transaction<'a>),
}

impl Conn {
    /// Opens `sqlite:PATH` (created if missing; WAL journal, a 5 s wait for the write lock) or
    /// `postgres://…` / `postgresql://…` ([`postgres::connect`]).
    pub fn open(url: &str) -> Result<Conn, DbError> {
        if let Some(path) = url.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(DbError(
                    "`sqlite:` needs a file path, e.g. sqlite:cachet.db".into(),
                ));
            }
            let c = rusqlite::Connection::open(path)
                .map_err(|e| DbError(format!("opening {path}: {e}")))?;
            c.pragma_update(None, "journal_mode", "WAL")?;
            c.busy_timeout(Duration::from_secs(5))?;
            Ok(Conn::Sqlite(c))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Conn::Postgres(Box::new(postgres::connect(url)?)))
        } else {
            Err(DbError(format!(
                "`{url}`: give sqlite:PATH or postgres://USER@HOST/DB"
            )))
        }
    }

    /// Another connection for reads only: SQLite's opened read-only (it never takes the write
    /// lock); PostgreSQL's as [`Conn::open`].
    pub fn open_reader(url: &str) -> Result<Conn, DbError> {
        match url.strip_prefix("sqlite:") {
            Some(path) => {
                let c = rusqlite::Connection::open_with_flags(
                    path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
                .map_err(|e| DbError(format!("opening {path}: {e}")))?;
                c.busy_timeout(Duration::from_secs(5))?;
                Ok(Conn::Sqlite(c))
            }
            None => Conn::open(url),
        }
    }

    /// Runs `f` in one transaction, committed when it returns `Ok`. SQLite's starts with the
    /// write lock taken (IMMEDIATE), so two writers queue instead of failing at commit.
    pub fn transaction<T, E: From<DbError>>(
        &mut self,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.begin(true, f)
    }

    /// Runs `f` in a read transaction (one consistent view; SQLite takes no write lock).
    pub fn read<T, E: From<DbError>>(
        &mut self,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.begin(false, f)
    }

    fn begin<T, E: From<DbError>>(
        &mut self,
        write: bool,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        use rusqlite::TransactionBehavior::{Deferred, Immediate};
        let mut tx = match self {
            Conn::Sqlite(c) => Tx::Sqlite(
                c.transaction_with_behavior(if write { Immediate } else { Deferred })
                    .map_err(DbError::from)?,
            ),
            Conn::Postgres(c) => Tx::Postgres(c.transaction().map_err(DbError::from)?),
        };
        let out = f(&mut tx)?;
        match tx {
            Tx::Sqlite(t) => t.commit().map_err(DbError::from)?,
            Tx::Postgres(t) => t.commit().map_err(DbError::from)?,
        }
        Ok(out)
    }

    /// One query outside a transaction.
    pub fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>, DbError> {
        self.read(|tx| tx.query(sql, params))
    }
}

impl Tx<'_> {
    pub fn is_postgres(&self) -> bool {
        matches!(self, Tx::Postgres(_))
    }

    /// Runs a statement; the rows it changed.
    pub fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64, DbError> {
        Ok(match self {
            Tx::Sqlite(t) => {
                t.execute(sql, rusqlite::params_from_iter(params.iter().map(sqlite)))? as u64
            }
            Tx::Postgres(t) => t.execute(
                sql,
                &pg_params(params)
                    .iter()
                    .map(|b| b.as_ref())
                    .collect::<Vec<_>>(),
            )?,
        })
    }

    /// Runs statements without parameters (a schema).
    pub fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        match self {
            Tx::Sqlite(t) => t.execute_batch(sql)?,
            Tx::Postgres(t) => t.batch_execute(sql)?,
        }
        Ok(())
    }

    /// The rows of a query, each column as a [`Val`] (BIGINT / INTEGER and TEXT columns).
    pub fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>, DbError> {
        match self {
            Tx::Sqlite(t) => {
                let mut st = t.prepare(sql)?;
                let n = st.column_count();
                let rows =
                    st.query_map(rusqlite::params_from_iter(params.iter().map(sqlite)), |r| {
                        (0..n)
                            .map(|i| {
                                Ok(match r.get_ref(i)? {
                                    rusqlite::types::ValueRef::Integer(v) => Val::I64(v),
                                    rusqlite::types::ValueRef::Text(t) => {
                                        Val::Text(String::from_utf8_lossy(t).into_owned())
                                    }
                                    _ => Val::Null,
                                })
                            })
                            .collect::<Result<Vec<_>, rusqlite::Error>>()
                    })?;
                Ok(rows.collect::<Result<_, _>>()?)
            }
            Tx::Postgres(t) => {
                let ps = pg_params(params);
                let rows = t.query(sql, &ps.iter().map(|b| b.as_ref()).collect::<Vec<_>>())?;
                Ok(rows
                    .iter()
                    .map(|r| {
                        (0..r.len())
                            .map(|i| {
                                use ::postgres::types::Type;
                                let ty = r.columns()[i].type_().clone();
                                if ty == Type::INT8 {
                                    r.get::<_, Option<i64>>(i).into()
                                } else if ty == Type::INT4 {
                                    r.get::<_, Option<i32>>(i).map(i64::from).into()
                                } else {
                                    // TEXT; anything else (a `void` result) reads as NULL.
                                    r.try_get::<_, Option<String>>(i)
                                        .ok()
                                        .flatten()
                                        .map_or(Val::Null, Val::Text)
                                }
                            })
                            .collect()
                    })
                    .collect())
            }
        }
    }
}

fn sqlite(v: &Val) -> rusqlite::types::Value {
    match v {
        Val::Null => rusqlite::types::Value::Null,
        Val::I64(i) => rusqlite::types::Value::Integer(*i),
        Val::Text(t) => rusqlite::types::Value::Text(t.clone()),
    }
}

fn pg_params(params: &[Val]) -> Vec<Box<dyn ::postgres::types::ToSql + Sync>> {
    params
        .iter()
        .map(|v| -> Box<dyn ::postgres::types::ToSql + Sync> {
            match v {
                Val::Null => Box::new(None::<i64>),
                Val::I64(i) => Box::new(*i),
                Val::Text(t) => Box::new(t.clone()),
            }
        })
        .collect()
}
