//! The limits of an open port, shared by `cachet serve` and `cachet worker` (defaults as nginx
//! and Envoy would have them for an API of streamed answers).

use std::time::Duration;

use cachet_gateway::http::lanes::{self, Lanes};
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
    /// Connections served at once from one client IP; more get 429 with Retry-After (plain
    /// HTTP; over TLS they are closed at once). (Behind a load balancer every client shares its
    /// IP: raise this to the cap.)
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
    /// Requests one client address may cancel before they are answered, within one second,
    /// across all its connections; past it every connection of the address is closed (a
    /// cancellation flood spread over many connections, each under its own limit). Behind a
    /// load balancer that does not pass the client's address, raise it.
    #[arg(long, default_value_t = 400)]
    pub max_cancels_per_client: u32,
    /// Seconds a connection may sit with no request in flight and no traffic before it is closed.
    #[arg(long, default_value_t = 60)]
    pub idle_timeout: u64,
    /// Seconds in-flight requests get to finish after SIGTERM.
    #[arg(long, default_value_t = 30)]
    pub grace_period: u64,
    /// Threads that serve connections, thread-per-core as nginx's workers: each connection, its
    /// requests and the upstream calls they make run start to end on one of them (no hand-offs
    /// between threads on a request's path). `auto`: one per CPU core this process may use; a
    /// number; or `shared`: every connection on one work-stealing runtime, which evens out very
    /// uneven requests at the cost of those hand-offs.
    #[arg(long, default_value = "auto", value_parser = parse_io_threads)]
    pub io_threads: IoThreads,
}

/// `--io-threads`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoThreads {
    /// One lane per core.
    Auto,
    /// This many lanes.
    Lanes(usize),
    /// No lanes: the shared runtime.
    Shared,
}

fn parse_io_threads(s: &str) -> Result<IoThreads, String> {
    match s {
        "auto" => Ok(IoThreads::Auto),
        "shared" => Ok(IoThreads::Shared),
        n => match n.parse::<usize>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(IoThreads::Lanes(n)),
            _ => Err(format!(
                "`{s}`: give `auto` (a thread per core), a number from 1 to 1024, or `shared`"
            )),
        },
    }
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

    /// The serving threads `--io-threads` asks for (none for `shared`), started; call before
    /// the upstream clients are made, so they keep a connection pool per thread.
    pub fn lanes(&self) -> std::io::Result<Option<std::sync::Arc<Lanes>>> {
        let n = match self.io_threads {
            IoThreads::Shared => return Ok(None),
            IoThreads::Auto => lanes::per_core(),
            IoThreads::Lanes(n) => n,
        };
        let l = Lanes::start(n)?;
        tracing::info!(
            io_threads = n,
            from_flag = self.io_threads != IoThreads::Auto,
            "serving connections on {n} threads, each connection on one"
        );
        Ok(Some(l))
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
            max_cancels_per_client: self.max_cancels_per_client.max(1),
            idle_timeout: s(self.idle_timeout),
            grace: Duration::from_secs(self.grace_period),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_threads_take_auto_a_count_or_shared_and_say_what_else_to_give() {
        assert_eq!(parse_io_threads("auto"), Ok(IoThreads::Auto));
        assert_eq!(parse_io_threads("shared"), Ok(IoThreads::Shared));
        assert_eq!(parse_io_threads("4"), Ok(IoThreads::Lanes(4)));
        for bad in ["0", "-1", "many", "5000"] {
            let e = parse_io_threads(bad).unwrap_err();
            assert!(e.contains("auto") && e.contains("shared"), "{e}");
        }
    }
}
