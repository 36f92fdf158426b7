//! What the process-level benchmarks read about the processes they start: CPU and memory from
//! `/proc/<pid>`, Redis's own CPU from `INFO`.
#![allow(dead_code)]

pub mod raw_load;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// CPU seconds (user + system) of a live process.
pub fn cpu_seconds(pid: u32) -> f64 {
    stat_ticks(pid, 11..13) / clock_ticks()
}

/// CPU seconds of this process's children that have exited and been waited for (the simulator
/// runs of a benchmark; also its short `redis-cli` calls).
pub fn reaped_children_cpu_seconds() -> f64 {
    stat_ticks(std::process::id(), 13..15) / clock_ticks()
}

/// The sum of `/proc/<pid>/stat` fields `fields`, counted after the command name (which may hold
/// spaces): 11 utime, 12 stime, 13 cutime, 14 cstime.
fn stat_ticks(pid: u32, fields: std::ops::Range<usize>) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    fields.filter_map(|i| f.get(i)?.parse::<f64>().ok()).sum()
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS:`, `VmHWM:`), 0 when unreadable.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Redis's own CPU seconds (user + system, from INFO): its cost per point, when nothing else
/// works it meanwhile.
pub fn redis_cpu_seconds(url: &str) -> f64 {
    let out = Command::new("redis-cli")
        .args(["-u", url, "INFO", "cpu"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .filter(|(k, _)| *k == "used_cpu_user" || *k == "used_cpu_sys")
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

/// Microseconds Redis has spent in `command` since its last CONFIG RESETSTAT (`INFO
/// commandstats`: `cmdstat_<command>:calls=..,usec=..`), 0 when it never ran.
pub fn redis_command_usec(url: &str, command: &str) -> f64 {
    let out = Command::new("redis-cli")
        .args(["-u", url, "INFO", "commandstats"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let prefix = format!("cmdstat_{command}:");
    out.lines()
        .filter_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .flat_map(|rest| rest.split(','))
        .filter_map(|kv| kv.strip_prefix("usec="))
        .filter_map(|v| v.parse::<f64>().ok())
        .sum()
}

/// CPU seconds of every process named `comm` (PostgreSQL's server and backends), counting the
/// children they reaped too: backends and autovacuum workers come and go, and an exited one's CPU
/// moves to its parent's cutime/cstime instead of vanishing from the sum.
pub fn cpu_seconds_named(comm: &str) -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .map(|pid| stat_ticks(pid, 11..15) / clock_ticks())
        .sum()
}

/// A port free a moment ago, for a process that must be told its port before it starts
/// (rumqttd and Mosquitto cannot report a port 0 they got; a process restarted on its port).
/// Anything that can bind port 0 itself does ([`ListenReport`] for `courier-pipeline`).
///
/// Chosen at random BELOW the kernel's ephemeral range: every outgoing connection (thousands
/// per test run) and every port-0 listener takes its port from that range, so a port picked
/// there and released could be taken by one of them before its process binds it (it happened:
/// rumqttd "not accepting connections", a restarted `run` unable to bind). Below it only
/// another explicit bind can collide; a port already taken is skipped.
pub fn free_addr() -> SocketAddr {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    // 12,000 ports under it: above the dev Redis Cluster's bus ports (17100..).
    let from = low.saturating_sub(12_000).max(1025);
    for _ in 0..1000 {
        let port = rand::random_range(from..low.max(from + 1));
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            return l.local_addr().unwrap();
        }
    }
    panic!("no free port in {from}..{low}");
}

/// Where a `courier-pipeline` process started on port 0 says what it bound: its
/// `LISTEN_REPORT` file (docs/operating.md), one `name=address` line per listener.
pub struct ListenReport {
    path: std::path::PathBuf,
}

impl ListenReport {
    /// Asks `cmd` to write its report into a fresh file.
    pub fn on(cmd: &mut Command) -> ListenReport {
        let path = std::env::temp_dir().join(format!("listen-{:x}", rand::random::<u64>()));
        cmd.env("LISTEN_REPORT", &path);
        ListenReport { path }
    }

    /// The addresses, once the process has bound all its listeners (it writes the file then);
    /// panics if it exits first or takes longer than 30 s.
    pub fn wait(&self, child: &mut Child, what: &str) -> Listeners {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(text) = std::fs::read_to_string(&self.path) {
                return Listeners::parse(&text);
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{what} exited ({status}) before it listened");
            }
            assert!(
                Instant::now() < deadline,
                "{what} never reported its listeners"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ListenReport {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The listeners a process reported, by name: `metrics`, `http`, `ws`, `broker`, `broker.tls`,
/// `edge.tcp`, `edge.tls`, `edge.ws`.
#[derive(Debug, Clone)]
pub struct Listeners(Vec<(String, SocketAddr)>);

impl Listeners {
    pub fn parse(text: &str) -> Listeners {
        Listeners(
            text.lines()
                .filter_map(|l| {
                    let (name, addr) = l.split_once('=')?;
                    Some((name.to_string(), addr.parse().ok()?))
                })
                .collect(),
        )
    }

    /// The (first) listener called `name`; panics naming what was reported when there is none.
    pub fn get(&self, name: &str) -> SocketAddr {
        self.find(name)
            .unwrap_or_else(|| panic!("no {name} listener reported: {:?}", self.0))
    }

    /// The (first) listener called `name`, if the process has one.
    pub fn find(&self, name: &str) -> Option<SocketAddr> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, a)| *a)
    }
}

/// A process this benchmark started, stopped by its PID when dropped.
pub struct Proc {
    pub name: &'static str,
    pub child: Child,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return; // finished on its own (the simulator does)
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one call of the project's HTTP client from synchronous code: on a thread of its own
/// with a one-thread runtime, so that it also works from inside a bench's runtime.
fn http_blocking<F, Fut>(call: F) -> Option<courier_wire::http_client::Answer>
where
    F: FnOnce(courier_wire::http_client::HttpClient) -> Fut + Send,
    Fut: std::future::Future<
        Output = Result<courier_wire::http_client::Answer, courier_wire::http_client::HttpError>,
    >,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            let client =
                courier_wire::http_client::HttpClient::new(Duration::from_secs(5), 64 << 20);
            rt.block_on(call(client)).ok()
        })
        .join()
        .ok()
        .flatten()
    })
}

/// `GET url`; `None` while nothing answers.
pub fn http_get(url: &str) -> Option<courier_wire::http_client::Answer> {
    http_blocking(|c| async move { c.get(url, &[]).await })
}

/// `POST url` with a JSON body and extra headers; `None` while nothing answers.
pub fn http_post_json(
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<courier_wire::http_client::Answer> {
    let body = body.to_string();
    http_blocking(|c| async move { c.post_json(url, headers, body).await })
}

/// `GET /metrics`, as text.
pub fn scrape(addr: SocketAddr) -> Option<String> {
    http_get(&format!("http://{addr}/metrics"))
        .filter(|a| a.status == 200)
        .map(|a| a.text())
}

/// The sum of every series of `name` whose labels contain `label` (e.g. `result="accepted"`).
pub fn metric(text: &str, name: &str, label: Option<&str>) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (n, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l),
            None => (series, ""),
        };
        if n == name && label.is_none_or(|l| labels.contains(l)) {
            *found.get_or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    found
}

pub fn wait_port(addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn spawn(name: &'static str, cmd: &mut Command, log: &Path) -> Proc {
    let out = std::fs::File::create(log).unwrap();
    let child = cmd
        .stdout(Stdio::null())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {name}: {e}"));
    Proc { name, child }
}

/// A knob from the environment, or its default when unset or unreadable.
pub fn env_or<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// How long one dependent load from memory takes on this machine right now, in ns: a walk of
/// a random cycle through 32 MiB (beyond the caches), so each step waits for the one before.
/// Redis's sorted-set and hash lookups are such loads, and this virtual machine's host makes
/// them slower in some hours than in others: a figure printed beside this one can be read
/// against it (docs/benchmarks.md, "How far one hour's figures are from another's").
pub fn memory_probe_ns() -> f64 {
    use rand::seq::SliceRandom;
    const SLOTS: usize = 8 << 20; // u32 each: 32 MiB
    const STEPS: usize = 2_000_000;
    let mut order: Vec<u32> = (0..SLOTS as u32).collect();
    order.shuffle(&mut rand::rng());
    let mut next = vec![0u32; SLOTS];
    for w in order.windows(2) {
        next[w[0] as usize] = w[1];
    }
    next[order[SLOTS - 1] as usize] = order[0];
    let mut at = order[0];
    let started = Instant::now();
    for _ in 0..STEPS {
        at = next[at as usize];
    }
    std::hint::black_box(at);
    started.elapsed().as_nanos() as f64 / STEPS as f64
}
