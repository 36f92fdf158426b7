//! A local Redis Cluster started through ./dev.

use super::*;

/// A Redis Cluster of this test alone (3 primaries + 3 replicas), started by `./dev cluster up`
/// on six free consecutive ports (each with its cluster-bus port, +10000) and stopped when
/// dropped. Opt-in: only the tests that need one pay its start-up (about 6 s).
pub struct TestCluster {
    pub first_port: u16,
    /// Seed URLs of every node.
    pub nodes: Vec<String>,
}

/// One node as `CLUSTER NODES` shows it.
#[derive(Debug, Clone)]
pub struct ClusterNode {
    pub id: String,
    pub port: u16,
    pub primary: bool,
    /// A replica's primary.
    pub primary_id: Option<String>,
    /// Slot ranges a primary serves.
    pub slots: Vec<(u16, u16)>,
}

fn ports_free(first: u16) -> bool {
    (first..first + 6)
        .flat_map(|p| [p, p + 10_000])
        .all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
}

impl TestCluster {
    pub fn start() -> TestCluster {
        let first_port = (0..50)
            .map(|_| 20_000 + (rand::random::<u16>() % 1_000) * 6)
            .find(|&p| ports_free(p))
            .expect("no six free ports for a test cluster");
        let out = Command::new(repo_root().join("dev"))
            .args(["cluster", "up"])
            .env("DEV_CLUSTER_PORT", first_port.to_string())
            .stderr(Stdio::inherit())
            .output()
            .expect("running ./dev cluster up");
        assert!(out.status.success(), "./dev cluster up failed");
        let text = String::from_utf8_lossy(&out.stdout);
        let nodes = text
            .lines()
            .find_map(|l| l.strip_prefix("REDIS_CLUSTER_NODES="))
            .expect("./dev cluster up printed no REDIS_CLUSTER_NODES")
            .split(',')
            .map(str::to_string)
            .collect();
        TestCluster { first_port, nodes }
    }

    pub fn target(&self) -> RedisTarget {
        RedisTarget::parse_cluster(&self.nodes).unwrap()
    }

    /// A plain connection to one node (what it alone holds, or a node-local command).
    pub async fn node(&self, port: u16) -> redis::aio::MultiplexedConnection {
        redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// `CLUSTER NODES` as seen from `port`.
    pub async fn topology(&self, port: u16) -> Vec<ClusterNode> {
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut self.node(port).await)
            .await
            .unwrap();
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                let port = f.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?;
                let flags = f.get(2)?;
                if flags.contains("fail") && !flags.contains("fail?") {
                    return None;
                }
                let slots = f[8.min(f.len())..]
                    .iter()
                    .filter_map(|r| {
                        let (a, b) = r.split_once('-').unwrap_or((r, r));
                        Some((a.parse().ok()?, b.parse().ok()?))
                    })
                    .collect();
                Some(ClusterNode {
                    id: f[0].to_string(),
                    port,
                    primary: flags.contains("master"),
                    primary_id: (f[3] != "-").then(|| f[3].to_string()),
                    slots,
                })
            })
            .collect()
    }

    /// The primary serving `slot` and its replica, as a node that is up sees them.
    pub async fn shard_of(&self, slot: u16, ask: u16) -> (ClusterNode, Option<ClusterNode>) {
        let t = self.topology(ask).await;
        let primary = t
            .iter()
            .find(|n| n.primary && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .cloned()
            .unwrap_or_else(|| panic!("no primary serves slot {slot}: {t:?}"));
        let replica = t
            .iter()
            .find(|n| n.primary_id.as_deref() == Some(primary.id.as_str()))
            .cloned();
        (primary, replica)
    }

    /// The port of the primary serving `slot` as `ask` sees it; `None` while no node that is up
    /// serves it (a primary failed, its replica not promoted yet).
    pub async fn primary_port(&self, slot: u16, ask: u16) -> Option<u16> {
        self.topology(ask)
            .await
            .into_iter()
            .find(|n| n.primary && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .map(|n| n.port)
    }

    /// The slot of `key` (CLUSTER KEYSLOT).
    pub async fn slot(&self, key: &str) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut self.node(self.first_port).await)
            .await
            .unwrap()
    }

    /// Every key of every primary that is up: (port, key).
    pub async fn keys_by_node(&self) -> Vec<(u16, String)> {
        let mut all = Vec::new();
        for n in self.topology(self.up_port().await).await {
            if !n.primary {
                continue;
            }
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*")
                .query_async(&mut self.node(n.port).await)
                .await
                .unwrap();
            all.extend(keys.into_iter().map(|k| (n.port, k)));
        }
        all
    }

    /// A node that answers.
    pub async fn up_port(&self) -> u16 {
        for p in self.first_port..self.first_port + 6 {
            if std::net::TcpStream::connect(("127.0.0.1", p)).is_ok() {
                return p;
            }
        }
        panic!("no node of the cluster answers");
    }

    /// The pid of the server on `port` (to kill it as a crash does).
    pub fn pid(&self, port: u16) -> u32 {
        let f = repo_root()
            .join(".dev")
            .join(format!("cluster-{}", self.first_port))
            .join(format!("{port}.pid"));
        std::fs::read_to_string(&f)
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("dev"))
            .args(["cluster", "down"])
            .env("DEV_CLUSTER_PORT", self.first_port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
