//! The limits of an open port, shared by `cachet serve` and `cachet worker` (defaults as nginx
//! and Envoy would have them for an API of streamed answers).

use std::time::Duration;

use cachet_gateway::http::serve::{BodyTimeouts, Limits};
use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct ConnectionArgs {
    /// Seconds a client has to send a request's headers, and to finish a TLS handshake
    /// (slowloris protection).
    #[arg(long, default_value_t = 10)]
    pub header_read_timeout: u64,
    /// Largest request head in bytes; larger requests get 431.
    #[arg(long, default_value_t = 32 * 1024)]
    pub max_header_bytes: usize,
    /// Seconds a request body may pause between two chunks before the request gets 408.
    #[arg(long, default_value_t = 10)]
    pub body_read_timeout: u64,
    /// Seconds a whole request body may take to arrive before the request gets 408.
    #[arg(long, default_value_t = 60)]
    pub body_total_timeout: u64,
    /// Connections served at once; at the cap, idle connections are closed to make room.
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,
    /// Connections served at once from one client IP; more are closed at once. (Behind a load
    /// balancer every client shares its IP: raise this to the cap.)
    #[arg(long, default_value_t = 256)]
    pub max_connections_per_ip: usize,
    /// HTTP/2 streams open at once on one connection.
    #[arg(long, default_value_t = 128)]
    pub http2_max_concurrent_streams: u32,
    /// Requests one connection may cancel (HTTP/2 RST_STREAM) before they are answered, within
    /// one second; a connection past it is closed with GOAWAY (an HTTP/2 "rapid reset" flood).
    /// A client that cancels what it no longer needs (an editor's completions as the user types)
    /// stays far below it.
    #[arg(long, default_value_t = 200)]
    pub http2_max_cancels_per_second: u32,
    /// Seconds a connection may sit with no request in flight and no traffic before it is closed.
    #[arg(long, default_value_t = 60)]
    pub idle_timeout: u64,
    /// Seconds in-flight requests get to finish after SIGTERM.
    #[arg(long, default_value_t = 30)]
    pub grace_period: u64,
}

impl ConnectionArgs {
    /// `--max-connections`, lowered (with a warning) to what the open-file limit allows.
    fn fitted_max_connections(&self) -> usize {
        let asked = self.max_connections.max(1);
        match cachet_gateway::http::serve::connections_that_fit() {
            Some(fit) if fit < asked => {
                tracing::warn!(
                    asked,
                    fit,
                    "--max-connections is above what the open-file limit (ulimit -n) allows; \
                     serving at most {fit} connections (raise the limit to serve more)"
                );
                fit
            }
            _ => asked,
        }
    }

    pub fn limits(&self) -> Limits {
        let s = |n: u64| Duration::from_secs(n.max(1));
        Limits {
            header_read_timeout: s(self.header_read_timeout),
            max_header_bytes: self.max_header_bytes,
            body: BodyTimeouts {
                chunk: s(self.body_read_timeout),
                total: s(self.body_total_timeout),
            },
            max_connections: self.fitted_max_connections(),
            max_connections_per_ip: self.max_connections_per_ip.max(1),
            max_concurrent_streams: self.http2_max_concurrent_streams.max(1),
            max_cancels_per_second: self.http2_max_cancels_per_second.max(1),
            idle_timeout: s(self.idle_timeout),
            grace: Duration::from_secs(self.grace_period),
        }
    }
}
