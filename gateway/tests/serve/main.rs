//! `cachet serve` end to end (SmolLM2 on the CPU), by area; one test binary.

mod api_fields;
mod bench;
mod body;
mod chat_templates;
mod common;
mod config_reload;
mod hostile;
mod hub;
mod ids;
mod models;
mod names;
mod openai_client;
mod operator;
mod otlp;
mod ready;
mod reliability;
mod security;
mod shared_limits;
mod state;
mod templates;
mod tenancy;
mod tls;
mod tokenize;
