//! The maps' settings (`[web]`), with defaults; checked once at start-up.

use courier_wire::ConfigError;
use serde::Deserialize;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct WebConfig {
    /// Serve `/ops` and `/track/<order>` (and their APIs) on `HTTP_LISTEN`.
    pub enabled: bool,
    /// Base-map tiles, a Leaflet URL template such as `https://tile.openstreetmap.org/{z}/{x}/{y}.png`
    /// (or your own OSM-based tile server). Unset: no tiles, a plain background with a scale
    /// (no request leaves the browser for a third party).
    pub tile_url: Option<String>,
    /// Attribution shown for the tiles (OSM's licence requires one: `© OpenStreetMap contributors`).
    pub tile_attribution: String,
    /// Couriers drawn one by one in a view at most; past it the view comes as grid clusters
    /// with counts.
    pub max_markers: usize,
    /// Columns of the cluster grid over the view at most (rows follow its aspect ratio); the
    /// page asks for one column per 64 px of its width, within this.
    pub cluster_columns: usize,
    /// Couriers one refresh reads from Redis at most (the cap of a clustered view): bounds the
    /// server's work whatever the zoom.
    pub max_scan: usize,
    /// A courier silent longer than this is drawn `late`.
    #[serde(with = "courier_wire::duration")]
    pub late_after: Duration,
    /// A courier within this of his eviction (`ingest.evict_after`) is drawn `evicting`.
    #[serde(with = "courier_wire::duration")]
    pub evict_warning: Duration,
    /// How often the operations map refreshes.
    #[serde(with = "courier_wire::duration")]
    pub refresh: Duration,
    /// Base URL of these pages as customers reach them (the orders API's `tracking_url`);
    /// unset: `http://<HTTP_LISTEN>`.
    pub public_url: Option<String>,
}

impl Default for WebConfig {
    fn default() -> Self {
        WebConfig {
            enabled: true,
            tile_url: None,
            tile_attribution: "© OpenStreetMap contributors".into(),
            max_markers: 2000,
            cluster_columns: 48,
            max_scan: 100_000,
            late_after: Duration::from_secs(10),
            evict_warning: Duration::from_secs(15),
            refresh: Duration::from_secs(1),
            public_url: None,
        }
    }
}

impl WebConfig {
    /// Checks the values that cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_markers == 0 || self.max_markers > 20_000 {
            return Err(ConfigError::new("web.max_markers", "must be 1-20000"));
        }
        if !(4..=256).contains(&self.cluster_columns) {
            return Err(ConfigError::new("web.cluster_columns", "must be 4-256"));
        }
        if self.max_scan < self.max_markers {
            return Err(ConfigError::new(
                "web.max_scan",
                "must be at least web.max_markers",
            ));
        }
        if self.refresh < Duration::from_millis(200) {
            return Err(ConfigError::new("web.refresh", "must be at least 200ms"));
        }
        if let Some(u) = &self.tile_url {
            let ok = (u.starts_with("https://") || u.starts_with("http://"))
                && ["{z}", "{x}", "{y}"].iter().all(|p| u.contains(p));
            if !ok {
                return Err(ConfigError::new(
                    "web.tile_url",
                    format!("{u:?} must be an http(s) URL with {{z}}, {{x}} and {{y}}"),
                ));
            }
        }
        if let Some(u) = &self.public_url {
            if !(u.starts_with("https://") || u.starts_with("http://")) {
                return Err(ConfigError::new(
                    "web.public_url",
                    format!("{u:?} must start with http:// or https://"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        WebConfig::default().validate().unwrap();
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let bad = |c: WebConfig| c.validate().unwrap_err().to_string();
        assert!(bad(WebConfig {
            tile_url: Some("ftp://x/{z}/{x}/{y}".into()),
            ..Default::default()
        })
        .contains("web.tile_url"));
        assert!(bad(WebConfig {
            tile_url: Some("https://x/tiles.png".into()),
            ..Default::default()
        })
        .contains("web.tile_url"));
        assert!(bad(WebConfig {
            max_markers: 0,
            ..Default::default()
        })
        .contains("web.max_markers"));
        assert!(bad(WebConfig {
            max_scan: 10,
            ..Default::default()
        })
        .contains("web.max_scan"));
        assert!(bad(WebConfig {
            public_url: Some("example.com".into()),
            ..Default::default()
        })
        .contains("web.public_url"));
    }
}
