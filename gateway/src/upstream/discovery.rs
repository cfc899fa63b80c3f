//! Workers found by DNS: an upstream whose URL's host names a set of addresses (a Kubernetes
//! headless service, `dns = true` in the config) is resolved again every few seconds. Each
//! address is a pool member of its own (`http://ADDRESS:PORT`); a new one is started (health
//! polls, KV-event subscription) and joins the pool once its health check answers; one no longer
//! resolved leaves — no new requests, its running ones run out, its polls and event stream stop.
//! A failed lookup changes nothing; an empty answer (no record: the service has no pods) empties
//! the set.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::{Resolver, TokioResolver};

use super::config::DiscoveryConfig;
use super::{Pool, Upstream};

/// How often a pending member's health is looked at before it joins.
const PENDING_POLL: Duration = Duration::from_millis(250);

/// An upstream URL whose host is resolved: `http://HOST:PORT[/PATH]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsName {
    pub host: String,
    pub port: u16,
    path: String,
}

impl DnsName {
    /// The parts of `url`, or what is wrong with it for discovery.
    pub fn parse(url: &str) -> Result<Self, DiscoveryError> {
        let rest = url.strip_prefix("http://").ok_or(DiscoveryError::NotHttp)?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .map_err(|_| DiscoveryError::BadPort(p.to_string()))?,
            ),
            None => (authority, 80),
        };
        if host.is_empty() || host.parse::<IpAddr>().is_ok() || host.starts_with('[') {
            return Err(DiscoveryError::NotAName(host.to_string()));
        }
        Ok(DnsName {
            host: host.to_string(),
            port,
            path: path.to_string(),
        })
    }

    /// The member URL of one address.
    pub fn url_for(&self, ip: IpAddr) -> String {
        match ip {
            IpAddr::V4(v4) => format!("http://{v4}:{}{}", self.port, self.path),
            IpAddr::V6(v6) => format!("http://[{v6}]:{}{}", self.port, self.path),
        }
    }
}

/// What keeps a pool's members from being discovered.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("dns = true needs an http:// URL (TLS certificates name hosts, not the addresses found; keep workers on a private network, or list each by name with https://)")]
    NotHttp,
    #[error("`{0}` is not a port number")]
    BadPort(String),
    #[error("dns = true needs a host name to resolve, not `{0}`")]
    NotAName(String),
    #[error("reading the system's DNS configuration")]
    SystemConfig(#[source] hickory_resolver::net::NetError),
    #[error("DNS resolver")]
    Resolver(#[source] hickory_resolver::net::NetError),
}

/// The resolver of `cfg`: its name server, or the system's (/etc/resolv.conf). Answers are not
/// cached here: each refresh asks again.
pub fn resolver(cfg: Option<&DiscoveryConfig>) -> Result<TokioResolver, DiscoveryError> {
    let mut builder = match cfg.and_then(|c| c.nameserver) {
        Some(addr) => {
            let mut udp = ConnectionConfig::udp();
            udp.port = addr.port();
            let mut tcp = ConnectionConfig::tcp();
            tcp.port = addr.port();
            let ns = NameServerConfig::new(addr.ip(), true, vec![udp, tcp]);
            Resolver::builder_with_config(
                ResolverConfig::from_name_servers(vec![ns]),
                TokioRuntimeProvider::default(),
            )
        }
        None => TokioResolver::builder_tokio().map_err(DiscoveryError::SystemConfig)?,
    };
    builder.options_mut().cache_size = 0;
    builder.build().map_err(DiscoveryError::Resolver)
}

/// The addresses `name` resolves to now: `None` when the lookup failed (no answer, a network
/// error), an empty set when the name has no records.
async fn lookup(resolver: &TokioResolver, name: &DnsName) -> Option<Vec<IpAddr>> {
    match resolver.lookup_ip(name.host.as_str()).await {
        Ok(found) => {
            let mut ips: Vec<IpAddr> = found.iter().collect();
            ips.sort();
            ips.dedup();
            Some(ips)
        }
        Err(e) if e.is_no_records_found() => Some(Vec::new()),
        Err(e) => {
            tracing::warn!(host = %name.host, error = %e, "worker discovery: lookup failed; keeping the members found before");
            None
        }
    }
}

/// Keeps `pool`'s members of `name` in step with its DNS records, for ever (spawn it). `start`
/// makes the member of one URL (a [`super::worker::Worker`], polling and following as it starts).
pub async fn follow(
    pool: Arc<Pool>,
    name: DnsName,
    refresh: Duration,
    resolver: TokioResolver,
    start: impl Fn(&str) -> Arc<dyn Upstream> + Send + Sync + 'static,
) {
    let mut members: HashMap<IpAddr, String> = HashMap::new();
    let mut pending: HashMap<IpAddr, Arc<dyn Upstream>> = HashMap::new();
    let mut next_lookup = tokio::time::Instant::now();
    loop {
        if tokio::time::Instant::now() >= next_lookup {
            next_lookup = tokio::time::Instant::now() + refresh;
            if let Some(ips) = lookup(&resolver, &name).await {
                for ip in &ips {
                    if !members.contains_key(ip) && !pending.contains_key(ip) {
                        let url = name.url_for(*ip);
                        tracing::info!(host = %name.host, member = %url, "worker discovery: new address; joins once healthy");
                        pending.insert(*ip, start(&url));
                    }
                }
                members.retain(|ip, url| {
                    let keep = ips.contains(ip);
                    if !keep {
                        tracing::info!(host = %name.host, member = %url, "worker discovery: address gone; leaves the pool");
                        pool.remove(url);
                    }
                    keep
                });
                pending.retain(|ip, up| {
                    let keep = ips.contains(ip);
                    if !keep {
                        up.stop();
                    }
                    keep
                });
            }
        }
        // Pending members join once their health check answers.
        let ready: Vec<IpAddr> = pending
            .iter()
            .filter(|(_, up)| up.view(&[]).healthy)
            .map(|(ip, _)| *ip)
            .collect();
        for ip in ready {
            let up = pending.remove(&ip).expect("pending");
            let url = up.name().to_string();
            tracing::info!(host = %name.host, member = %url, "worker discovery: healthy; joins the pool");
            pool.add(up);
            members.insert(ip, url);
        }
        let wait = if pending.is_empty() {
            next_lookup.saturating_duration_since(tokio::time::Instant::now())
        } else {
            PENDING_POLL.min(next_lookup.saturating_duration_since(tokio::time::Instant::now()))
        };
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovered_urls_keep_the_port_and_path_and_refuse_what_cannot_be_resolved() {
        let n = DnsName::parse("http://cachet-worker.default.svc:9001/").unwrap();
        assert_eq!(
            (n.host.as_str(), n.port),
            ("cachet-worker.default.svc", 9001)
        );
        assert_eq!(
            n.url_for("10.1.2.3".parse().unwrap()),
            "http://10.1.2.3:9001"
        );
        assert_eq!(
            n.url_for("fd00::7".parse().unwrap()),
            "http://[fd00::7]:9001"
        );
        assert_eq!(
            DnsName::parse("http://w/api")
                .unwrap()
                .url_for("10.0.0.1".parse().unwrap()),
            "http://10.0.0.1:80/api"
        );
        let err = |url| DnsName::parse(url).unwrap_err().to_string();
        assert!(err("https://w:9001").contains("http://"));
        assert!(err("http://10.0.0.2:9001").contains("host name"));
        assert!(err("http://w:port").contains("port"));
    }
}
