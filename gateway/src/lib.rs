//! The Cachet gateway library: tenants, and (growing) the HTTPS server in front of the engine.

pub mod server;
pub mod tenants;
