//! The `[[upstream]]` tables of the config file (where the gateway sends requests) and
//! `[discovery]` (how names of workers are resolved), checked as they are read.

use serde::Deserialize;

/// `[discovery]`: the name server that resolves `dns = true` upstreams (default: the system's,
/// from /etc/resolv.conf — in Kubernetes, the cluster DNS).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// `IP:PORT` of a DNS server.
    pub nameserver: Option<std::net::SocketAddr>,
}

/// An `[[upstream]]` of the config file: where the gateway sends requests (read at start-up).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum UpstreamConfig {
    /// A `cachet worker` at `url` (exact prefix routing from its KV events). An `https://` URL
    /// is verified against the system's roots and `ca_file`'s certificates (PEM), if given.
    /// `dns = true`: the URL's host names a set of workers (a Kubernetes headless service),
    /// resolved again every `dns_refresh_secs` (default 10): each address is a member, a new
    /// one joins once its health check answers, a gone one leaves (its requests run out).
    Cachet {
        url: String,
        #[serde(default)]
        ca_file: Option<std::path::PathBuf>,
        #[serde(default)]
        dns: bool,
        #[serde(default)]
        dns_refresh_secs: Option<u64>,
    },
    /// The gateway's own engine, as one member of the pool.
    Embedded {},
    /// Any OpenAI-compatible server at `url` (`/v1/completions`; text in, approximate routing
    /// from the prompts sent there). `model`: the name it serves (default: the gateway's model
    /// id); `api_key_env`: an environment variable holding its API key; `history_blocks`: how many
    /// prompt blocks the gateway remembers sending (about the server's KV cache, default 65536);
    /// `cache_salt`: send each request's cache salt (the tenant's) as vLLM's `cache_salt`, so
    /// the server keeps tenants' caches apart too (default true; false for servers that refuse
    /// the field); `ca_file`: as for `cachet`.
    Openai {
        url: String,
        model: Option<String>,
        api_key_env: Option<String>,
        history_blocks: Option<usize>,
        cache_salt: Option<bool>,
        #[serde(default)]
        ca_file: Option<std::path::PathBuf>,
    },
}

/// An upstream's URL — http:// or https:// (TLS, verified against the system's roots and the
/// certificates of `ca_file`) — and its CA file: only for an https:// URL, and readable, with
/// at least one certificate. Checked at load, so a bad one is not found on every request.
pub fn check_upstream_url(url: &str, ca_file: Option<&std::path::Path>) -> Result<(), BadUpstream> {
    let https = url.starts_with("https://");
    if !https && !url.starts_with("http://") {
        return Err(BadUpstream(format!(
            "`{url}` is not an http:// or https:// URL"
        )));
    }
    if let Some(ca) = ca_file {
        if !https {
            return Err(BadUpstream(format!(
                "`{url}`: ca_file `{}` is for https:// upstreams; this one is plain HTTP",
                ca.display()
            )));
        }
        crate::http::client::read_ca_file(ca).map_err(|e| {
            BadUpstream(format!(
                "`{url}`: ca_file {}",
                crate::error::with_causes(&e)
            ))
        })?;
    }
    Ok(())
}

pub fn validate(upstreams: &[UpstreamConfig]) -> Result<(), BadUpstream> {
    let mut seen = std::collections::HashSet::new();
    for u in upstreams {
        let name = match u {
            UpstreamConfig::Cachet {
                url,
                ca_file,
                dns,
                dns_refresh_secs,
            } => {
                check_upstream_url(url, ca_file.as_deref())?;
                if *dns {
                    super::discovery::DnsName::parse(url)
                        .map_err(|e| BadUpstream(format!("`{url}`: {e}")))?;
                }
                if dns_refresh_secs.is_some() && !dns {
                    return Err(BadUpstream(format!(
                        "`{url}`: dns_refresh_secs is for dns = true upstreams"
                    )));
                }
                if *dns_refresh_secs == Some(0) {
                    return Err(BadUpstream(format!(
                        "`{url}`: dns_refresh_secs must be at least 1"
                    )));
                }
                url.trim_end_matches('/').to_string()
            }
            UpstreamConfig::Embedded {} => "embedded".to_string(),
            UpstreamConfig::Openai {
                url,
                api_key_env,
                history_blocks,
                ca_file,
                ..
            } => {
                check_upstream_url(url, ca_file.as_deref())?;
                if let Some(v) = api_key_env {
                    if std::env::var(v).is_err() {
                        return Err(BadUpstream(format!(
                            "`{url}`: api_key_env names `{v}`, which is not set"
                        )));
                    }
                }
                if *history_blocks == Some(0) {
                    return Err(BadUpstream(format!(
                        "`{url}`: history_blocks must be at least 1"
                    )));
                }
                url.trim_end_matches('/').to_string()
            }
        };
        if !seen.insert(name.clone()) {
            return Err(BadUpstream(format!("`{name}` is listed twice")));
        }
    }
    Ok(())
}

/// An upstream the config cannot use, and why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadUpstream(pub String);
