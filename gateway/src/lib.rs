//! The Cachet gateway library: tenants, the HTTPS server in front of the engine, and the
//! sandbox that runs tenants' prompt templates.

pub mod normalize;
pub mod route;
pub mod sandbox;
pub mod server;
pub mod tenants;
pub mod upstream;
pub mod worker;
