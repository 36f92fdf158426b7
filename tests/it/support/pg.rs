//! PostgreSQL: connections, a schema per test, a throwaway cluster a test can stop.

use super::*;

pub async fn pg_connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to postgres: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A fresh schema of its own for one test: `url` sets the search path to it, so the
/// migrations, partitions and reads of that test land there and nowhere else.
pub struct PgSchema {
    pub url: String,
    pub name: String,
}

/// Adds `options=-csearch_path=<schema>` to a PostgreSQL URL.
pub fn with_search_path(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-csearch_path%3D{schema}")
}

pub async fn pg_schema() -> PgSchema {
    let name = format!("t{:016x}", rand::random::<u64>());
    let base = &services().database_url;
    pg_connect(base)
        .await
        .batch_execute(&format!("CREATE SCHEMA {name}"))
        .await
        .unwrap();
    PgSchema {
        url: with_search_path(base, &name),
        name,
    }
}

impl PgSchema {
    pub async fn drop(self) {
        let _ = pg_connect(&services().database_url)
            .await
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name))
            .await;
    }
}

/// A throwaway PostgreSQL cluster that a test can stop and start: initdb + pg_ctl of the newest
/// installed version, on a free port, in a temp dir, as the `postgres` user when running as root
/// (PostgreSQL refuses root), exactly as ./dev does.
pub struct TempPostgres {
    pub url: String,
    port: u16,
    dir: PathBuf,
    bin: PathBuf,
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn pg_bin_dir() -> PathBuf {
    let mut dirs: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL not installed: run ./dev test (it installs it)")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e
                .file_name()
                .to_string_lossy()
                .split('.')
                .map(|p| p.parse().ok())
                .collect::<Option<Vec<u32>>>()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((v, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().expect("no /usr/lib/postgresql/*/bin/pg_ctl").1
}

impl TempPostgres {
    fn as_pg(&self, tool: &str) -> Command {
        let exe = self.bin.join(tool);
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        }
    }

    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("pg-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            assert!(
                Command::new("chown")
                    .arg("postgres")
                    .arg(&dir)
                    .status()
                    .unwrap()
                    .success(),
                "chown postgres"
            );
        }
        // PostgreSQL is told its port (and restarted on it by the fault tests): chosen here.
        let port = free_addr().port();
        let pg = TempPostgres {
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            port,
            dir,
            bin: pg_bin_dir(),
        };
        let out = pg
            .as_pg("initdb")
            .arg("-D")
            .arg(pg.dir.join("data"))
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pg.start_again();
        pg
    }

    /// Starts the (stopped) server again on the same port.
    pub fn start_again(&self) {
        let out = self
            .as_pg("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-w", "-t", "30", "-o"])
            .arg(format!(
                "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off",
                self.port,
                self.dir.display()
            ))
            .arg("start")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops the server (fast: open transactions are rolled back, connections cut).
    pub fn stop(&self) {
        let out = self
            .as_pg("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "fast", "-w", "stop"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        let _ = self
            .as_pg("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
