//! What the process-level benchmarks read about the processes they start: CPU and memory from
//! `/proc/<pid>`, Redis's own CPU from `INFO`.
#![allow(dead_code)]

use std::process::Command;

/// CPU seconds (user + system) of a live process.
pub fn cpu_seconds(pid: u32) -> f64 {
    stat_ticks(pid, 11..13) / clock_ticks()
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
