//! The Kubernetes deployment (`deploy/kubernetes`) and the image (`Dockerfile`) agree with the
//! Kubernetes API and with the binary they run: the manifests validate against the API schemas
//! (kubernetes-validate from PyPI, strict), every flag and CACHET_ variable they give `cachet`
//! exists in its `--help`, probes hit routes the server answers, the cluster config's key
//! placeholders are refused and, filled in, it passes `cachet tenant check` and names the
//! workers and Redis the manifests create; the LICENSE is the one Cargo.toml declares.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cachet(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cachet"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// deploy_check.py's summary of the manifests (validated on the way).
fn manifests() -> Vec<Value> {
    let site = cachet_tests::pip_target(
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("py-kubernetes-validate"),
        &["kubernetes-validate"],
        "kubernetes_validate",
    );
    let out = Command::new("python3")
        .arg(root().join("tests/python/deploy_check.py"))
        .arg(root().join("deploy/kubernetes"))
        .env("PYTHONPATH", &site)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the manifests do not validate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn find<'a>(all: &'a [Value], kind: &str, name: &str) -> &'a Value {
    all.iter()
        .find(|w| w["kind"] == kind && w["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn the_kubernetes_manifests_validate_and_match_the_binary() {
    let all = manifests();
    let gateway = find(&all, "Deployment", "cachet-gateway");
    let worker = find(&all, "StatefulSet", "cachet-worker");
    let redis_svc = find(&all, "Service", "cachet-redis");
    let worker_svc = find(&all, "Service", "cachet-worker");
    assert_eq!(
        worker_svc["headless"], true,
        "workers need stable DNS names"
    );

    // Each cachet container: its subcommand's flags and environment variables exist, its
    // probes are routes that subcommand's server answers, it runs as a user, not root.
    let routes = BTreeMap::from([
        ("serve", vec!["/health", "/ready"]),
        ("worker", vec!["/health"]),
    ]);
    for w in [gateway, worker] {
        let pod = &w["pod_security"];
        assert_eq!(pod["runAsNonRoot"], true, "{}", w["name"]);
        assert!(pod["runAsUser"].as_u64().unwrap() > 0);
        for c in w["containers"].as_array().unwrap() {
            let args: Vec<&str> = c["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            let sub = args[0];
            let (ok, help) = cachet(&[sub, "--help"]);
            assert!(ok, "cachet {sub} --help: {help}");
            for flag in args.iter().filter(|a| a.starts_with("--")) {
                assert!(
                    help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                    "{}: `cachet {sub}` has no {flag}",
                    w["name"]
                );
            }
            for env in c["env"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_str().unwrap())
            {
                if env.starts_with("CACHET_") && env != "CACHET_CACHE_DIR" {
                    assert!(
                        help.contains(&format!("[env: {env}=")),
                        "{}: `cachet {sub}` reads no {env}",
                        w["name"]
                    );
                }
            }
            // The listen port is the container's port.
            let listen = args[args.iter().position(|a| *a == "--listen").unwrap() + 1];
            let port: u64 = listen.rsplit(':').next().unwrap().parse().unwrap();
            assert_eq!(c["ports"][0], port, "{}", w["name"]);
            for (probe, path) in c["probes"].as_object().unwrap() {
                assert!(
                    routes[sub].contains(&path.as_str().unwrap()),
                    "{} {probe}: `cachet {sub}` does not answer {path}",
                    w["name"]
                );
            }
            assert_eq!(c["security"]["allowPrivilegeEscalation"], false);
        }
    }
    assert_eq!(worker["containers"][0]["gpus"], 1);
    assert_eq!(gateway["annotations"]["prometheus.io/path"], "/metrics");

    // The cluster config: valid, finding the workers through their headless Service by DNS,
    // Redis at its Service, and the replica count the gateway Deployment runs.
    // As shipped its keys are placeholders, refused by name; with real hashes put in (as the
    // README says) it passes.
    let cfg_path = root().join("deploy/kubernetes/cachet.toml");
    let (ok, out) = cachet(&["tenant", "check", cfg_path.to_str().unwrap()]);
    assert!(!ok && out.contains("REPLACE-ME"), "{out}");
    let shipped = std::fs::read_to_string(&cfg_path).unwrap();
    let filled = shipped
        .replace("REPLACE-ME: the sha256 of a tenant's key", &"a".repeat(64))
        .replace(
            "REPLACE-ME: the sha256 of an operator's key",
            &"b".repeat(64),
        );
    assert!(
        !filled.contains("REPLACE-ME"),
        "a placeholder the test does not fill"
    );
    let filled_path =
        std::env::temp_dir().join(format!("cachet-deploy-{}.toml", std::process::id()));
    std::fs::write(&filled_path, &filled).unwrap();
    let (ok, out) = cachet(&["tenant", "check", filled_path.to_str().unwrap()]);
    assert!(ok, "{out}");
    let cfg: toml::Value = toml::from_str(&shipped).unwrap();
    let ups = cfg["upstream"].as_array().unwrap();
    assert_eq!(ups.len(), 1);
    let port = worker_svc["ports"][0].as_u64().unwrap();
    assert_eq!(
        ups[0]["url"].as_str().unwrap(),
        format!("http://cachet-worker:{port}")
    );
    assert_eq!(ups[0]["dns"].as_bool(), Some(true));
    assert!(worker["replicas"].as_u64().unwrap() >= 1);
    let shared = &cfg["shared_limits"];
    assert_eq!(
        shared["redis_url"].as_str().unwrap(),
        format!("redis://cachet-redis:{}/0", redis_svc["ports"][0])
    );
    assert_eq!(
        shared["replicas"].as_integer().unwrap() as u64,
        gateway["replicas"].as_u64().unwrap()
    );
    // The operator store and the usage records: the PostgreSQL of postgres.yaml, through the
    // variable the gateway container sets (from the Secret) and `cachet serve` reads.
    let op = &cfg["operator"];
    let var = op["database_env"].as_str().unwrap();
    let genv: Vec<&str> = gateway["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(genv.contains(&var), "the gateway sets no {var}: {genv:?}");
    assert_eq!(
        var, "CACHET_USAGE_DB",
        "usage and operator store share one database"
    );
    assert!(!op["key"].as_array().unwrap().is_empty());
    let pg = find(&all, "StatefulSet", "cachet-postgres");
    let pg_svc = find(&all, "Service", "cachet-postgres");
    assert_eq!(pg_svc["ports"][0], 5432);
    assert_eq!(pg["replicas"], 1);
}

#[test]
fn the_image_runs_cachet_as_an_unprivileged_user() {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let stages: Vec<&str> = text.split("\nFROM ").collect();
    assert!(stages.len() >= 2, "a multi-stage build");
    let last = stages.last().unwrap();
    assert!(
        last.starts_with("nvidia/cuda:13."),
        "the run stage has CUDA 13's runtime libraries: {}",
        last.lines().next().unwrap()
    );
    let user = last
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .next_back()
        .expect("a USER");
    assert!(
        !user.starts_with('0') && !user.starts_with("root"),
        "{user}"
    );
    assert!(last.contains("ENTRYPOINT [\"cachet\"]"));
    // The ports the manifests use are exposed, and the build copies the binary the tests run.
    assert!(last.contains("EXPOSE 8000 9001"));
    assert!(text.contains("cargo build --release -p cachet-gateway --bin cachet"));
    // The gateway's state has a home that is not the working directory, on a volume.
    assert!(last.contains("CACHET_STATE_DIR=/var/lib/cachet"));
    assert!(last.contains("VOLUME [\"/models\", \"/var/lib/cachet\"]"));
}

/// The LICENSE file is the license `Cargo.toml` declares, whole (its terms and the appendix).
#[test]
fn the_license_file_is_the_one_cargo_declares() {
    let cargo = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    assert!(
        cargo.contains("license = \"Apache-2.0\""),
        "the workspace's license changed"
    );
    let text = std::fs::read_to_string(root().join("LICENSE")).unwrap();
    let head: Vec<&str> = text.lines().take(2).map(str::trim).collect();
    assert_eq!(head, ["Apache License", "Version 2.0, January 2004"]);
    for part in [
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
        "9. Accepting Warranty or Additional Liability.",
        "END OF TERMS AND CONDITIONS",
        "http://www.apache.org/licenses/LICENSE-2.0",
    ] {
        assert!(text.contains(part), "LICENSE lacks `{part}`");
    }
}
