//! The Grafana dashboard (ops/grafana-dashboard.json) queries only metrics the code emits.

#[test]
fn dashboard_queries_only_known_metrics() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/ops/grafana-dashboard.json"
    ))
    .unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut used = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            // Drop quoted label values, then take identifiers with an underscore that are not
            // PromQL functions: those are metric names.
            let unquoted: String = expr.split('"').step_by(2).collect::<Vec<_>>().join(" ");
            let names: Vec<&str> = unquoted
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|t| t.contains('_') && *t != "histogram_quantile")
                .collect();
            assert!(!names.is_empty(), "no metric in {expr}");
            for n in names {
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .fold(n, |n, s| n.strip_suffix(s).unwrap_or(n));
                assert!(
                    courier_wire::metrics::ALL.contains(&base),
                    "dashboard uses unknown metric {n} in {expr}"
                );
                used += 1;
            }
        }
    }
    assert!(used >= 20);
}
