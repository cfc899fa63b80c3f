//! The config file (TOML, see `examples/cachet.toml`): `[[tenant]]` tables (read by
//! [`crate::tenants`]), `[[upstream]]` tables — where the gateway sends requests for `--model`,
//! read at start-up — and `[[model]]` tables: further models, each with its own upstreams.

use serde::Deserialize;

pub use crate::tenants::config::{InvalidTenant, TenantConfig};
pub use crate::upstream::config::{
    check_upstream_url, BadUpstream, DiscoveryConfig, UpstreamConfig,
};

/// The whole config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub tenant: Vec<TenantConfig>,
    #[serde(default)]
    pub upstream: Vec<UpstreamConfig>,
    /// Models served beside `--model`, each by its own upstreams.
    #[serde(default)]
    pub model: Vec<ModelEntry>,
    /// Prompt starts whose cached blocks every tenant shares (see
    /// [`crate::normalize::public`]).
    #[serde(default)]
    pub public_prefix: Vec<crate::normalize::public::PublicPrefixConfig>,
    /// Prices per model, turning usage records' tokens into spend.
    #[serde(default)]
    pub price: Vec<crate::usage::Price>,
    /// How upstreams named by DNS are resolved.
    #[serde(default)]
    pub discovery: Option<DiscoveryConfig>,
    /// Tenant limits kept in Redis for every replica of the gateway (read at start-up).
    #[serde(default)]
    pub shared_limits: Option<crate::tenants::shared::SharedLimitsConfig>,
    /// Tenants kept in a database and changed live through the operator API (read at
    /// start-up; the `[[tenant]]` tables are then imported on the database's first start).
    #[serde(default)]
    pub operator: Option<crate::operator::OperatorConfig>,
}

impl ConfigFile {
    /// Parses a config document; the upstreams are checked here, the tenants by
    /// [`crate::tenants::TenantRegistry::from_configs`].
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let file: ConfigFile = toml::from_str(text)?;
        crate::upstream::config::validate(&file.upstream)?;
        for m in &file.model {
            m.validate()?;
        }
        // A worker serves one model: the same upstream under two models is a mistake.
        let all: Vec<UpstreamConfig> = file
            .upstream
            .iter()
            .chain(file.model.iter().flat_map(|m| &m.upstream))
            .cloned()
            .collect();
        crate::upstream::config::validate(&all)?;
        if let Some(s) = &file.shared_limits {
            s.validate()?;
        }
        if let Some(o) = &file.operator {
            o.validate()?;
        }
        Ok(file)
    }
}

/// A `[[model]]`: a further model the gateway serves (`--model` is the first), by requests'
/// `model` naming one of its served names. Its text side (tokenizer, chat template, generation
/// defaults, length) is read from `model` (no weights); its requests run on its own
/// `[[model.upstream]]`s: `cachet` workers or OpenAI-compatible servers running it (the
/// process's one engine serves `--model`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// A Hugging Face id, a built-in name, an HF directory or a .gguf file.
    pub model: String,
    /// The Hub revision of a model given by id.
    pub revision: Option<String>,
    /// The names clients send (default: the model's id).
    #[serde(default)]
    pub served_model_name: Vec<String>,
    /// A Jinja chat template file instead of the model's own.
    pub chat_template: Option<std::path::PathBuf>,
    /// Longest prompt + output admitted (default: the model's own context length).
    pub max_model_len: Option<usize>,
    #[serde(default)]
    pub upstream: Vec<UpstreamConfig>,
}

impl ModelEntry {
    fn validate(&self) -> Result<(), BadUpstream> {
        let what = format!("[[model]] `{}`", self.model);
        if self.upstream.is_empty() {
            return Err(BadUpstream(format!(
                "{what} has no [[model.upstream]]: give the `cachet` workers or OpenAI-compatible servers that run it"
            )));
        }
        if self
            .upstream
            .iter()
            .any(|u| matches!(u, UpstreamConfig::Embedded {}))
        {
            return Err(BadUpstream(format!(
                "{what}: the embedded engine serves --model (one engine per process); run this model in a `cachet worker` and list it as kind = \"cachet\""
            )));
        }
        if self.max_model_len == Some(0) {
            return Err(BadUpstream(format!(
                "{what}: max_model_len must be at least 1"
            )));
        }
        crate::upstream::config::validate(&self.upstream)
            .map_err(|e| BadUpstream(format!("{what}: {e}")))
    }
}

/// The tenant registry of a config document's `[[tenant]]` tables, the whole document checked.
pub fn tenant_registry(
    text: &str,
    deployment_key: &[u8; 32],
    now: std::time::Instant,
) -> Result<crate::tenants::TenantRegistry, ConfigError> {
    let file = ConfigFile::parse(text)?;
    Ok(crate::tenants::TenantRegistry::from_configs(
        file.tenant,
        deployment_key,
        now,
    )?)
}

/// The `[[upstream]]` entries of a config file.
pub fn upstreams_from_toml(text: &str) -> Result<Vec<UpstreamConfig>, ConfigError> {
    Ok(ConfigFile::parse(text)?.upstream)
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("tenants config: {0}")]
    Toml(#[from] toml::de::Error),
    #[error(transparent)]
    Tenant(#[from] InvalidTenant),
    #[error("upstream: {0}")]
    Upstream(#[from] BadUpstream),
    #[error(transparent)]
    SharedLimits(#[from] crate::tenants::shared::InvalidSharedLimits),
    #[error(transparent)]
    Operator(#[from] crate::operator::InvalidOperatorConfig),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_are_read_with_their_upstreams_and_bad_ones_refused() {
        let ok = r#"
            [[model]]
            model = "Qwen/Qwen3-8B"
            served_model_name = ["qwen"]
            [[model.upstream]]
            kind = "cachet"
            url = "http://10.0.0.5:9000"
        "#;
        let f = ConfigFile::parse(ok).unwrap();
        assert_eq!(f.model[0].served_model_name, ["qwen"]);
        assert_eq!(f.model[0].upstream.len(), 1);
        let err = |t: &str| ConfigFile::parse(t).unwrap_err().to_string();
        assert!(err("[[model]]\nmodel = \"m\"\n").contains("has no [[model.upstream]]"));
        assert!(
            err("[[model]]\nmodel = \"m\"\n[[model.upstream]]\nkind = \"embedded\"\n")
                .contains("one engine per process")
        );
        assert!(err("[[model]]\nmodel = \"m\"\nsize = 3\n").contains("unknown field `size`"));
        let twice =
            format!("[[upstream]]\nkind = \"cachet\"\nurl = \"http://10.0.0.5:9000\"\n{ok}");
        assert!(err(&twice).contains("listed twice"), "{}", err(&twice));
    }

    #[test]
    fn upstreams_are_read_from_the_config_and_bad_ones_refused() {
        let ok = r#"
    [[tenant]]
    id = "a"
    api_key_sha256 = ["0000000000000000000000000000000000000000000000000000000000000000"]

    [[upstream]]
    kind = "embedded"

    [[upstream]]
    kind = "cachet"
    url = "http://10.0.0.2:9000/"
    "#;
        assert_eq!(
            upstreams_from_toml(ok).unwrap(),
            vec![
                UpstreamConfig::Embedded {},
                UpstreamConfig::Cachet {
                    url: "http://10.0.0.2:9000/".into(),
                    ca_file: None,
                    dns: false,
                    dns_refresh_secs: None,
                }
            ]
        );
        assert!(upstreams_from_toml("").unwrap().is_empty());
        let err = |t: &str| upstreams_from_toml(t).unwrap_err().to_string();
        assert!(err("[[upstream]]\nkind = \"vllm\"\n").contains("unknown variant `vllm`"));
        assert!(err("[[upstream]]\nkind = \"cachet\"\n").contains("missing field `url`"));
        assert!(
            err("[[upstream]]\nkind = \"cachet\"\nurl = \"10.0.0.2\"\n").contains("not an http")
        );
        // Every remote kind takes https:// (the system's roots), with a CA file of its own if named:
        // only for https://, and one that reads as PEM certificates — checked at load.
        let ca = std::env::temp_dir().join(format!("cachet-ca-{}.pem", std::process::id()));
        std::fs::write(&ca, "not a certificate\n").unwrap();
        for kind in ["cachet", "openai"] {
            let up = |url: &str, extra: &str| {
                format!("[[upstream]]\nkind = \"{kind}\"\nurl = \"{url}\"\n{extra}")
            };
            assert!(
                upstreams_from_toml(&up("https://10.0.0.2:9000", "")).is_ok(),
                "{kind}"
            );
            let e = err(&up(
                "http://10.0.0.2:9000",
                "ca_file = \"/etc/ssl/x.pem\"\n",
            ));
            assert!(
                e.contains("ca_file") && e.contains("plain HTTP"),
                "{kind}: {e}"
            );
            let e = err(&up(
                "https://10.0.0.2:9000",
                "ca_file = \"/no/such/ca.pem\"\n",
            ));
            assert!(e.contains("/no/such/ca.pem"), "{kind}: {e}");
            let e = err(&up(
                "https://10.0.0.2:9000",
                &format!("ca_file = \"{}\"\n", ca.display()),
            ));
            assert!(e.contains("no CERTIFICATE"), "{kind}: {e}");
        }
        std::fs::remove_file(&ca).unwrap();
        assert!(
            err("[[upstream]]\nkind = \"embedded\"\n[[upstream]]\nkind = \"embedded\"\n")
                .contains("listed twice")
        );
        assert!(
            err("[[upstream]]\nkind = \"embedded\"\nurl = \"http://x\"\n")
                .contains("unknown field")
        );
        // And the tenants part still parses the same file.
        tenant_registry(ok, &[0; 32], std::time::Instant::now()).unwrap();
    }

    #[test]
    fn shared_limits_config_is_checked_by_field() {
        let bad = |extra: &str| {
            let text = format!("[shared_limits]\n{extra}");
            crate::config::ConfigFile::parse(&text)
                .unwrap_err()
                .to_string()
        };
        assert!(bad("redis_url = \"http://x\"").contains("shared_limits.redis_url"));
        assert!(bad("redis_url = \"redis://x\"\nreplicas = 0").contains("replicas"));
        assert!(bad("redis_url = \"redis://x\"\ntimeout_ms = 0").contains("timeout_ms"));
        assert!(bad("redis_url = \"redis://x\"\non_error = \"maybe\"").contains("on_error"));
        assert!(bad("redis_url = \"redis://x\"\nkey_prefix = \"{a}\"").contains("key_prefix"));
        assert!(bad("redis_url = \"redis://x\"\nlease_secs = 0").contains("lease_secs"));
    }
}
