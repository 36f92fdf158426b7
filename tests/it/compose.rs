//! No Docker engine runs on our machines, so docker-compose.yaml is checked here against the
//! CLI contract: every pipeline service runs a real subcommand with settings the binary knows,
//! URLs point at services that exist on the ports they listen on, ports are bound to loopback,
//! and only PostgreSQL keeps a volume.

use serde_norway::Value;
use std::collections::BTreeMap;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_courier-pipeline");

fn compose() -> Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docker-compose.yaml"))
        .unwrap();
    let mut v: Value = serde_norway::from_str(&text).unwrap();
    v.apply_merge().unwrap();
    // Merge keys nest (`<<: *ingest` where ingest itself merged `*pipeline`): apply until stable.
    for _ in 0..3 {
        v.apply_merge().unwrap();
    }
    v
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

fn help(cmd: &str) -> String {
    let out = Command::new(BIN).args([cmd, "--help"]).output().unwrap();
    assert!(
        out.status.success(),
        "`courier-pipeline {cmd}` is not a command"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// host, port of a URL like mqtt://broker:1883 or postgres://u:p@postgres:5432/db.
fn host_port(url: &str) -> (String, u16) {
    let rest = url.split_once("://").unwrap().1;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let hp = rest.split('/').next().unwrap();
    let (h, p) = hp.split_once(':').unwrap();
    (h.to_string(), p.parse().unwrap())
}

/// Secrets have no fallback in the file: a default would be a key published in this repository,
/// used silently wherever the variable is unset. `${VAR:?message}` makes compose refuse instead.
#[test]
fn secrets_have_no_published_default() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docker-compose.yaml"))
        .unwrap();
    for secret in ["SERVICE_KEY", "POSTGRES_PASSWORD", "EDGE_BUS_TOKEN"] {
        let uses: Vec<&str> = text
            .match_indices(&format!("${{{secret}"))
            .map(|(i, _)| &text[i..i + text[i..].find('}').unwrap() + 1])
            .collect();
        assert!(!uses.is_empty(), "{secret} is not used");
        for u in uses {
            assert!(
                u.starts_with(&format!("${{{secret}:?")),
                "{u}: a secret must be required (`${{{secret}:?...}}`), not defaulted"
            );
        }
    }
}

#[test]
fn compose_matches_the_cli_contract() {
    let c = compose();
    let services = c["services"].as_mapping().unwrap();
    let names: Vec<String> = services.keys().map(s).collect();
    let mut roles: BTreeMap<String, usize> = BTreeMap::new();
    // What each service listens on, from its environment (container side).
    let mut listens: BTreeMap<String, Vec<u16>> = BTreeMap::new();
    listens.insert("redis".into(), vec![6379]);
    listens.insert("postgres".into(), vec![5432]);
    for (name, svc) in services {
        let name = s(name);
        if let Some(env) = svc["environment"].as_mapping() {
            for (k, v) in env {
                if s(k).ends_with("_LISTEN") {
                    let port = s(v).rsplit(':').next().unwrap().parse().unwrap();
                    listens.entry(name.clone()).or_default().push(port);
                }
            }
        }
    }

    for (name, svc) in services {
        let name = s(name);
        for port in svc["ports"].as_sequence().into_iter().flatten() {
            assert!(
                s(port).starts_with("127.0.0.1:"),
                "{name}: port {} not bound to 127.0.0.1",
                s(port)
            );
        }
        if name != "postgres" && name != "mosquitto" {
            // No state; only key files, read-only, each mounted alone.
            for m in svc["volumes"].as_sequence().into_iter().flatten() {
                let m = s(m);
                let file = m.strip_prefix("./keys/").and_then(|r| r.split(':').next());
                assert!(
                    file.is_some_and(|f| m == format!("./keys/{f}:/keys/{f}:ro")),
                    "{name} mounts {m}: only ./keys/<file>:/keys/<file>:ro"
                );
            }
        }
        if svc["image"].as_str() != Some("courier-pipeline:latest") {
            continue;
        }
        assert!(svc.get("healthcheck").is_some(), "{name}: no healthcheck");
        let cmd = s(&svc["command"][0]);
        let help_text = help(&cmd);
        *roles.entry(cmd.clone()).or_default() += 1;
        for (k, v) in svc["environment"].as_mapping().unwrap() {
            let (k, v) = (s(k), s(v));
            assert!(
                help_text.contains(&format!("[env: {k}")),
                "{name}: `{cmd}` knows no setting {k}"
            );
            if k.ends_with("_URL") {
                let (host, port) = host_port(&v);
                assert!(
                    names.contains(&host),
                    "{name}: {k} points at unknown service {host}"
                );
                assert!(
                    listens.get(&host).is_some_and(|p| p.contains(&port)),
                    "{name}: {k} uses port {port}, {host} does not listen there"
                );
            }
        }
        // Health checks ask the service's own metrics listener.
        let test: Vec<String> = svc["healthcheck"]["test"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(s)
            .collect();
        assert_eq!(&test[..3], ["CMD", "courier-pipeline", "health"], "{name}");
        let metrics_port = s(&svc["environment"]["METRICS_LISTEN"])
            .rsplit(':')
            .next()
            .unwrap()
            .to_string();
        assert!(
            test[3].contains(&format!(":{metrics_port}/")),
            "{name}: health check misses its metrics port"
        );
    }
    assert_eq!(roles.get("broker"), Some(&1));
    assert_eq!(roles.get("edge"), Some(&1));
    // Phones reach the edge only: the bus publishes no port.
    assert!(services[&serde_norway::Value::from("broker")]
        .get("ports")
        .is_none());
    assert!(
        roles.get("ingest").copied().unwrap_or(0) >= 2,
        "two ingest workers"
    );
    assert_eq!(roles.get("history-writer"), Some(&1));
    assert_eq!(roles.get("fanout"), Some(&1));
    assert_eq!(roles.get("notify"), Some(&1));
    let volumes: Vec<String> = c["volumes"].as_mapping().unwrap().keys().map(s).collect();
    assert_eq!(volumes, ["pgdata"]);
}

/// Each service holds the private keys of what it mints and the public keys of what it checks,
/// nothing more: the internet-facing edge and the bus get no private key at all.
#[test]
fn each_service_mounts_only_the_keys_its_role_needs() {
    let c = compose();
    let want: BTreeMap<&str, &[&str]> = [
        ("broker", &["bus.pub"][..]),
        ("edge", &["courier.pub"][..]),
        ("ingest", &["bus.key", "bus.pub"][..]),
        (
            "history-writer",
            &[
                "bus.key",
                "bus.pub",
                "courier.pub",
                "ops.pub",
                "privacy.pub",
                "trail.pub",
            ][..],
        ),
        (
            "fanout",
            &["bus.key", "bus.pub", "ops.pub", "viewer.key", "viewer.pub"][..],
        ),
        ("notify", &[][..]),
    ]
    .into_iter()
    .collect();
    for (name, svc) in c["services"].as_mapping().unwrap() {
        if svc["image"].as_str() != Some("courier-pipeline:latest") {
            continue;
        }
        let cmd = s(&svc["command"][0]);
        let mut files: Vec<String> = svc["volumes"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(|m| {
                s(m).split(':')
                    .nth(1)
                    .unwrap()
                    .trim_start_matches("/keys/")
                    .to_string()
            })
            .collect();
        files.sort();
        assert_eq!(files, want[cmd.as_str()], "{}", s(name));
        if !files.is_empty() {
            assert_eq!(
                s(&svc["environment"]["AUTH_KEY_DIR"]),
                "/keys",
                "{}",
                s(name)
            );
        }
    }
}
