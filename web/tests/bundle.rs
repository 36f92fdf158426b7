//! The checked-in bundles (web/assets/) were built from the UI sources and lockfile as they
//! are now: each bundle's header records the sha256 that web/ui/build.mjs computed over them,
//! recomputed here without npm. A UI change that was not rebuilt (`./dev web`) fails.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

fn ui() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ui")
}

/// The same walk as sourcesSha256() in web/ui/build.mjs.
fn sources_sha256() -> String {
    let mut files = vec![
        "build.mjs".to_string(),
        "package-lock.json".into(),
        "package.json".into(),
    ];
    for e in std::fs::read_dir(ui().join("src")).unwrap() {
        files.push(format!("src/{}", e.unwrap().file_name().to_string_lossy()));
    }
    files.sort();
    let mut h = Sha256::new();
    for f in &files {
        let bytes = std::fs::read(ui().join(f)).unwrap();
        h.update(format!("{f}\n{}\n", bytes.len()).as_bytes());
        h.update(&bytes);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn bundles_record_the_sources_they_were_built_from() {
    let want = sources_sha256();
    for a in web::assets::BUNDLES {
        let got = web::assets::recorded_sources_hash(a.bytes)
            .unwrap_or_else(|| panic!("{} has no sources-sha256 header", a.name));
        assert_eq!(
            got, want,
            "web/assets/{} was built from other sources than web/ui/ holds now: run ./dev web",
            a.name
        );
    }
    for page in ["ops.html", "track.html"] {
        assert_eq!(
            std::fs::read(ui().join("src").join(page)).unwrap(),
            std::fs::read(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("assets")
                    .join(page)
            )
            .unwrap(),
            "web/assets/{page} differs from web/ui/src/{page}: run ./dev web"
        );
    }
}

#[test]
fn the_lockfile_pins_every_package_with_an_integrity_hash() {
    let lock: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ui().join("package-lock.json")).unwrap()).unwrap();
    let packages = lock["packages"].as_object().unwrap();
    assert!(packages.len() > 3);
    for (path, p) in packages {
        if path.is_empty() {
            continue;
        }
        assert!(
            p["integrity"]
                .as_str()
                .is_some_and(|i| i.starts_with("sha512-")),
            "{path} has no integrity hash"
        );
    }
}
