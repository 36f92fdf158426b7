//! A cheap load generator for the live-path benchmarks: the points phones send
//! (`{"id","lat","lon","ts","seq"}` on `couriers/<id>/loc`, QoS 0), encoded here as MQTT 3.1.1
//! PUBLISH frames and written in large writes over a few plain TCP connections, so that at
//! 150,000 points/s the load takes a small share of the two cores (the simulator spends about
//! 7 µs a point on its thousands of rumqttc clients). Every courier sends every `interval`
//! seconds with seq rising by one and ts the send time, as the simulator's phones do; the
//! ledger counts each point whose frame was written to a socket in full.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What to send: `couriers` couriers (`<id_prefix><i:05>`) for `seconds`, `rate` points/s in
/// all, over `connections` connections; `token` is a bus token the broker accepts.
pub struct RawLoad {
    pub addr: String,
    pub token: String,
    pub couriers: u64,
    pub rate: u64,
    pub seconds: u64,
    pub connections: usize,
    pub id_prefix: String,
}

/// What a run did: points written, and the CPU seconds its threads used.
pub struct Sent {
    pub points: u64,
    pub cpu_seconds: f64,
}

const TICK: Duration = Duration::from_millis(5);

impl RawLoad {
    /// Sends for `seconds`, then closes the connections; returns the ledger.
    pub fn run(&self) -> Sent {
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..self.connections)
            .map(|c| {
                let mine: Vec<u64> = (0..self.couriers)
                    .filter(|i| *i as usize % self.connections == c)
                    .collect();
                let rate = self.rate as f64 / self.connections as f64;
                let (addr, token, prefix) = (
                    self.addr.clone(),
                    self.token.clone(),
                    self.id_prefix.clone(),
                );
                let seconds = self.seconds;
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let cpu0 = thread_cpu_seconds();
                    let n = send(&addr, &token, c, &prefix, &mine, rate, seconds, &stop);
                    (n, thread_cpu_seconds() - cpu0)
                })
            })
            .collect();
        let mut sent = Sent {
            points: 0,
            cpu_seconds: 0.0,
        };
        for t in threads {
            let (n, cpu) = t.join().expect("load thread");
            sent.points += n;
            sent.cpu_seconds += cpu;
        }
        sent
    }
}

/// One connection's share: logs in, then each tick writes the frames due by then in one write.
#[allow(clippy::too_many_arguments)]
fn send(
    addr: &str,
    token: &str,
    conn: usize,
    prefix: &str,
    couriers: &[u64],
    rate: f64,
    seconds: u64,
    stop: &AtomicBool,
) -> u64 {
    let mut s = TcpStream::connect(addr).expect("broker reachable");
    let client_id = format!("rawload-{}-{prefix}{conn}", std::process::id());
    s.write_all(&connect_frame(&client_id, "simulator", token))
        .unwrap();
    let mut ack = [0u8; 4];
    s.read_exact(&mut ack).expect("CONNACK");
    assert_eq!(ack, [0x20, 2, 0, 0], "broker refused the login");
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let mut seq = vec![0u64; couriers.len()];
    let (mut next, mut written) = (0usize, 0u64);
    let mut buf = Vec::with_capacity(1 << 20);
    let mut payload = Vec::with_capacity(128);
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let due = (now.duration_since(start).as_secs_f64() * rate) as u64;
        if due > written && !couriers.is_empty() {
            let ts = unix_now();
            buf.clear();
            for _ in written..due {
                let i = next;
                next = (next + 1) % couriers.len();
                seq[i] += 1;
                let id = couriers[i];
                // A courier drifts along a diagonal from a start of his own, a few metres a point.
                let lat = 24.5 + (id % 1000) as f64 * 4e-4 + seq[i] as f64 * 2e-5;
                let lon = 46.5 + (id / 1000 % 1000) as f64 * 4e-4 + seq[i] as f64 * 2e-5;
                payload.clear();
                payload.extend_from_slice(b"{\"id\":\"");
                let _ = write!(payload, "{prefix}{id:05}");
                payload.extend_from_slice(b"\",\"lat\":");
                let _ = write!(payload, "{lat}");
                payload.extend_from_slice(b",\"lon\":");
                let _ = write!(payload, "{lon}");
                payload.extend_from_slice(b",\"ts\":");
                let _ = write!(payload, "{ts}");
                let _ = write!(payload, ",\"seq\":{}}}", seq[i]);
                let topic_len = "couriers/".len() + prefix.len() + 5.max(digits(id)) + "/loc".len();
                buf.push(0x30); // PUBLISH, QoS 0
                remaining_length(&mut buf, 2 + topic_len + payload.len());
                buf.extend_from_slice(&(topic_len as u16).to_be_bytes());
                let _ = write!(buf, "couriers/{prefix}{id:05}/loc");
                buf.extend_from_slice(&payload);
            }
            if s.write_all(&buf).is_err() {
                break;
            }
            written = due;
        }
        std::thread::sleep(TICK);
    }
    let _ = s.write_all(&[0xE0, 0]); // DISCONNECT
    let _ = s.flush();
    written
}

fn digits(n: u64) -> usize {
    n.checked_ilog10().unwrap_or(0) as usize + 1
}

/// MQTT 3.1.1 CONNECT: clean session, keep-alive 60 s (a run is shorter), username + password.
fn connect_frame(client_id: &str, user: &str, password: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&[0, 4, b'M', b'Q', b'T', b'T', 4, 0xC2, 0, 60]);
    for f in [client_id, user, password] {
        body.extend_from_slice(&(f.len() as u16).to_be_bytes());
        body.extend_from_slice(f.as_bytes());
    }
    let mut frame = vec![0x10];
    remaining_length(&mut frame, body.len());
    frame.extend_from_slice(&body);
    frame
}

fn remaining_length(buf: &mut Vec<u8>, mut n: usize) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        buf.push(b);
        if n == 0 {
            return;
        }
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// CPU seconds of the calling thread (`/proc/thread-self/stat`, utime + stime).
fn thread_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = (11..13).filter_map(|i| f.get(i)?.parse::<f64>().ok()).sum();
    ticks / super::clock_ticks()
}
