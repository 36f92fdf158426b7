//! The batch script as it was before the packed layout (`script_v1.lua`: five ARGV strings per
//! entry, state as `seq|phone_ts|epoch_ts|server_ts` text), with its argument builder and reply
//! reader: the baseline of `benches/script.rs`, and the reference that `tests/script.rs` holds
//! the current script to (same verdicts, same state, and it reads the state v1 left).
#![allow(dead_code)]

use ingest::batch::{Entry, Plan, Verdict};

pub const LUA: &str = include_str!("script_v1.lua");

/// `now`, `reset_after`, then five strings per entry (id, lon, lat, seq, ts; seq "off" and the
/// other three empty for an `offline` status).
pub fn args(plan: &Plan<'_>, now: f64, reset_after: f64) -> Vec<Vec<u8>> {
    let mut f = ryu::Buffer::new();
    let mut args = Vec::with_capacity(2 + plan.entries.len() * 5);
    args.push(f.format(now).as_bytes().to_vec());
    args.push(f.format(reset_after).as_bytes().to_vec());
    for e in &plan.entries {
        match e {
            Entry::Point { point, .. } => {
                args.push(point.id.as_bytes().to_vec());
                args.push(f.format(point.lon).as_bytes().to_vec());
                args.push(f.format(point.lat).as_bytes().to_vec());
                args.push(point.seq.to_string().into_bytes());
                args.push(f.format(point.ts).as_bytes().to_vec());
            }
            Entry::Offline(id) => {
                args.push(id.as_bytes().to_vec());
                args.extend([vec![], vec![], b"off".to_vec(), vec![]]);
            }
        }
    }
    args
}

/// The flat `code, order` reply of v1, in plan order.
pub fn parse_reply(reply: &[redis::Value]) -> Vec<Verdict> {
    use redis::Value;
    reply
        .chunks_exact(2)
        .map(|pair| {
            let Value::Int(code) = pair[0] else {
                panic!("v1 code {:?}", pair[0])
            };
            // v1 knew one order per courier and no places.
            let orders = match &pair[1] {
                Value::BulkString(b) if !b.is_empty() => Some(
                    vec![ingest::batch::Carried {
                        order: String::from_utf8(b.clone()).unwrap(),
                        places: None,
                    }]
                    .into(),
                ),
                _ => None,
            };
            match code {
                0 => Verdict::Stale,
                1 | 2 => Verdict::Accepted {
                    reset: code == 2,
                    orders,
                },
                3 => Verdict::Offline,
                c => panic!("v1 code {c}"),
            }
        })
        .collect()
}
