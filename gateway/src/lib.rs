//! The Cachet gateway library. The path of a request, by module:
//!
//! - [`http`]: plumbing both servers share (accept loop and limits, bodies, errors, TLS, the
//!   upstream client);
//! - [`server`]: the API — authentication, validation, templates, normalization, tokenization,
//!   admission, responses; [`tenants`] (keys, limits, salts), [`sandbox`] (tenant templates in
//!   wasmtime), [`normalize`] (volatile values out of the cacheable prefix);
//! - [`route`]: routing policies; [`upstream`]: where requests run (the embedded engine,
//!   `cachet worker`s, OpenAI-compatible servers) and the pool over them;
//! - [`worker`]: the `cachet worker` server; [`protocol`]: its wire format;
//! - [`config`]: the config file; [`db`]: SQLite and PostgreSQL for the operator store and
//!   the usage records.

pub mod config;
pub mod db;
pub mod error;
pub mod http;
pub mod normalize;
pub mod operator;
pub mod protocol;
pub mod route;
pub mod sandbox;
pub mod server;
pub mod tenants;
pub mod trace;
pub mod upstream;
pub mod usage;
pub mod worker;
