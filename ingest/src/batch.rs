//! The pure core of a batch: received messages in, script arguments and verdicts out. No I/O,
//! so validation, the argument layout and reply parsing are tested without Redis.

use crate::events::Tally;
use crate::pack::Packer;
use bytes::Bytes;
use courier_wire::events::Places;
use courier_wire::{decode_point, parse_courier_topic, CourierTopic, Invalid, Point, Validation};
use std::sync::Arc;

/// One MQTT message as the receive loop hands it on.
#[derive(Debug, Clone)]
pub struct Message {
    pub topic: String,
    pub payload: Bytes,
    /// Server receive time, unix seconds.
    pub received: f64,
}

/// One entry of the batch script.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry<'a> {
    Point {
        point: Point<'a>,
        received: f64,
    },
    /// `offline` on `couriers/{id}/status`: leave the live index now.
    Offline(&'a str),
}

/// What the script must decide, plus what was refused before it.
#[derive(Debug, Default)]
pub struct Plan<'a> {
    pub entries: Vec<Entry<'a>>,
    pub tally: Tally,
}

impl Plan<'_> {
    pub(crate) fn points(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| matches!(e, Entry::Point { .. }))
            .count() as u64
    }

    /// The batch did not reach Redis: its points are errors, and so are its `offline` statuses
    /// (those couriers stay live until the eviction sweep): counted, not forgotten.
    pub(crate) fn failed(&mut self) {
        let points = self.points();
        self.tally.errors += points;
        self.tally.status_errors += self.entries.len() as u64 - points;
    }
}

/// Validates a batch of messages. Bad payloads are counted by reason and left out; the good
/// ones beside them go on.
pub fn plan<'a>(messages: &'a [Message], limits: &Validation, now: f64) -> Plan<'a> {
    let mut plan = Plan {
        entries: Vec::with_capacity(messages.len()),
        tally: Tally::default(),
    };
    for m in messages {
        match parse_courier_topic(&m.topic) {
            Some(CourierTopic::Loc(id)) => match decode_point(id, &m.payload, now, limits) {
                Ok(point) => plan.entries.push(Entry::Point {
                    point,
                    received: m.received,
                }),
                Err(why) => plan.tally.invalid[why.index()] += 1,
            },
            Some(CourierTopic::Status(id)) if m.payload.as_ref().trim_ascii() == b"offline" => {
                plan.entries.push(Entry::Offline(id));
            }
            Some(CourierTopic::Status(_)) => {} // `online`: nothing to record
            // Only a loc filter reaches here with a topic we cannot parse: an id that is too
            // long or has characters we refuse.
            None if m.topic.ends_with("/loc") => plan.tally.invalid[Invalid::BadId.index()] += 1,
            None => {}
        }
    }
    plan
}

/// One call of the batch script: its arguments, and how its reply maps back onto the plan.
///
/// The script judges a batch courier by courier: each courier once (his state and order read
/// once, at most one GEOADD/ZADD/HSET for him), his entries in their batch order. Entries of
/// different couriers do not depend on each other, so only each courier's own order matters.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptCall {
    /// ARGV: `now`, `reset_after`, the packed batch, `seen_every` (see `script.lua`).
    pub args: Vec<Vec<u8>>,
    /// The plan entry of each entry the script judges, in the script's order.
    judged: Vec<usize>,
    /// The courier (1-based, as the script counts them) of each plan entry.
    courier: Vec<u32>,
    couriers: usize,
}

impl ScriptCall {
    /// Couriers in the batch (each once).
    #[cfg(test)]
    fn couriers(&self) -> usize {
        self.couriers
    }
}

/// The script's arguments after the keys: `now`, `reset_after` (strings), then one MessagePack
/// array: per courier, in the order of his first entry, his id, how many entries he has, and
/// per entry `seq, ts, score`, where score is the location's GEO score ([`geo_score`], as a
/// decimal string: ZADD takes it as it is); an `offline` status is `false, false, false`; then
/// `seen_every` (seconds, `ingest.seen_every`; 0: `seen` written for every accepted point).
pub fn script_call(
    plan: &Plan<'_>,
    now: f64,
    reset_after_secs: f64,
    seen_every_secs: f64,
) -> ScriptCall {
    let entries = &plan.entries;
    fn id<'a>(e: &Entry<'a>) -> &'a str {
        match e {
            Entry::Point { point, .. } => point.id,
            Entry::Offline(id) => id,
        }
    }
    // Number the couriers in the order they first appear, then list each one's entries.
    let mut index: std::collections::HashMap<&str, u32> =
        std::collections::HashMap::with_capacity(entries.len());
    let mut courier = Vec::with_capacity(entries.len());
    let mut count: Vec<u32> = Vec::with_capacity(entries.len());
    for e in entries {
        let next = index.len() as u32 + 1;
        let c = *index.entry(id(e)).or_insert(next);
        if c == next {
            count.push(0);
        }
        count[c as usize - 1] += 1;
        courier.push(c);
    }
    let mut start = Vec::with_capacity(count.len() + 1);
    start.push(0usize);
    for n in &count {
        start.push(start[start.len() - 1] + *n as usize);
    }
    let mut fill = start.clone();
    let mut judged = vec![0; entries.len()];
    for (i, c) in courier.iter().enumerate() {
        let slot = &mut fill[*c as usize - 1];
        judged[*slot] = i;
        *slot += 1;
    }

    let mut f = ryu::Buffer::new();
    let mut p = Packer::with_capacity(16 + entries.len() * 72);
    p.array(count.len() * 2 + entries.len() * 3);
    for (c, n) in count.iter().enumerate() {
        let mine = &judged[start[c]..start[c + 1]];
        p.str(id(&entries[mine[0]]).as_bytes());
        p.uint(u64::from(*n));
        for &i in mine {
            match &entries[i] {
                Entry::Point { point, .. } => {
                    p.uint(point.seq);
                    p.f64(point.ts);
                    p.str(geo_score(point.lon, point.lat).to_string().as_bytes());
                }
                Entry::Offline(_) => (0..3).for_each(|_| p.bool(false)),
            }
        }
    }
    ScriptCall {
        args: vec![
            f.format(now).as_bytes().to_vec(),
            f.format(reset_after_secs).as_bytes().to_vec(),
            p.into_bytes(),
            f.format(seen_every_secs).as_bytes().to_vec(),
        ],
        judged,
        courier,
        couriers: count.len(),
    }
}

/// The score GEOADD gives a location in Redis (its 52-bit geohash, `geohashEncodeWGS84` with
/// step 26, then `geohashAlign52Bits`), computed here so the script writes it with a plain ZADD.
/// `lat` within +-85.05112878 and `lon` within +-180, as validation ensures.
pub fn geo_score(lon: f64, lat: f64) -> u64 {
    const LAT_MAX: f64 = 85.05112878;
    const STEP: u32 = 26;
    let lat_offset = (lat + LAT_MAX) / (2.0 * LAT_MAX) * (1u64 << STEP) as f64;
    let lon_offset = (lon + 180.0) / 360.0 * (1u64 << STEP) as f64;
    interleave(lat_offset as u32, lon_offset as u32)
}

/// Bits of `x` on the even positions, of `y` on the odd ones (geohash.c `interleave64`).
fn interleave(x: u32, y: u32) -> u64 {
    fn spread(v: u32) -> u64 {
        let mut v = u64::from(v);
        v = (v | (v << 16)) & 0x0000_FFFF_0000_FFFF;
        v = (v | (v << 8)) & 0x00FF_00FF_00FF_00FF;
        v = (v | (v << 4)) & 0x0F0F_0F0F_0F0F_0F0F;
        v = (v | (v << 2)) & 0x3333_3333_3333_3333;
        (v | (v << 1)) & 0x5555_5555_5555_5555
    }
    spread(x) | (spread(y) << 1)
}

/// The script's decision on one entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Stale,
    /// Became the last location; `reset` when it restarted the courier's seq; `orders`: what
    /// the courier carries (shared by his entries of the batch).
    Accepted {
        reset: bool,
        orders: Option<Arc<[Carried]>>,
    },
    Offline,
}

/// One order a courier carries, with its places (`None`: no places, or unreadable ones).
#[derive(Debug, Clone, PartialEq)]
pub struct Carried {
    pub order: String,
    pub places: Option<Places>,
}

/// Reads the script's reply: a string of one code per judged entry (`0` stale, `1` accepted,
/// `2` accepted as a seq reset, `3` offline handled), then `courier, orders, places` for each
/// courier with an accepted point who carries an order (orders: his `courier:order` value,
/// comma-separated; places: one `order:places` value or nil per order). Returns the verdicts
/// in plan order.
pub fn parse_reply(reply: &[redis::Value], call: &ScriptCall) -> Result<Vec<Verdict>, String> {
    use redis::Value;
    let codes = match reply.first() {
        Some(Value::BulkString(b)) if b.len() == call.judged.len() => b,
        Some(Value::BulkString(b)) => {
            return Err(format!(
                "batch script returned {} verdicts for {} entries",
                b.len(),
                call.judged.len()
            ))
        }
        other => return Err(format!("unexpected verdicts {other:?}")),
    };
    let rest = &reply[1..];
    if rest.len() % 3 != 0 {
        return Err(format!("courier/orders/places list of {}", rest.len()));
    }
    let mut orders: Vec<Option<Arc<[Carried]>>> = vec![None; call.couriers];
    for t in rest.chunks_exact(3) {
        let c = match &t[0] {
            Value::Int(c) if (1..=call.couriers as i64).contains(c) => *c as usize,
            other => return Err(format!("unexpected courier {other:?}")),
        };
        let list = match &t[1] {
            Value::BulkString(b) => {
                std::str::from_utf8(b).map_err(|_| "order id is not UTF-8".to_string())?
            }
            other => return Err(format!("unexpected order {other:?}")),
        };
        let places = match &t[2] {
            Value::Array(p) => p.as_slice(),
            Value::Nil => &[],
            other => return Err(format!("unexpected places {other:?}")),
        };
        let carried: Vec<Carried> = list
            .split(',')
            .filter(|o| !o.is_empty())
            .enumerate()
            .map(|(i, o)| Carried {
                order: o.to_string(),
                places: match places.get(i) {
                    Some(Value::BulkString(b)) => {
                        std::str::from_utf8(b).ok().and_then(Places::decode)
                    }
                    _ => None,
                },
            })
            .collect();
        if !carried.is_empty() {
            orders[c - 1] = Some(carried.into());
        }
    }
    let mut verdicts = vec![Verdict::Stale; call.judged.len()];
    for (&code, &i) in codes.iter().zip(&call.judged) {
        verdicts[i] = match code {
            b'0' => Verdict::Stale,
            b'1' | b'2' => Verdict::Accepted {
                reset: code == b'2',
                orders: orders[call.courier[i] as usize - 1].clone(),
            },
            b'3' => Verdict::Offline,
            c => return Err(format!("unknown verdict code {c}")),
        };
    }
    Ok(verdicts)
}

pub use courier_wire::seq_state::SeqState;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use redis::Value;

    const NOW: f64 = 1_764_460_800.0;

    fn msg(topic: &str, payload: &str) -> Message {
        Message {
            topic: topic.into(),
            payload: Bytes::copy_from_slice(payload.as_bytes()),
            received: NOW,
        }
    }

    fn good(id: &str, seq: u64) -> Message {
        msg(
            &format!("couriers/{id}/loc"),
            &format!(
                r#"{{"id":"{id}","lat":24.7,"lon":46.6,"ts":{},"seq":{seq}}}"#,
                NOW - 1.0
            ),
        )
    }

    #[test]
    fn bad_payloads_are_counted_and_good_ones_kept() {
        let msgs = vec![
            good("c1", 1),
            msg("couriers/c1/loc", "garbage"),
            good("c2", 5),
            msg(
                "couriers/c3/loc",
                r#"{"id":"c4","lat":1,"lon":1,"ts":1,"seq":1}"#,
            ),
            msg(&format!("couriers/{}/loc", "x".repeat(80)), "{}"),
            msg("couriers/c2/status", "offline"),
            msg("couriers/c2/status", "online"),
        ];
        let p = plan(&msgs, &Validation::default(), NOW);
        assert_eq!(p.entries.len(), 3);
        assert_eq!(p.points(), 2);
        assert_eq!(p.entries[2], Entry::Offline("c2"));
        assert_eq!(p.tally.invalid[Invalid::NotJson.index()], 1);
        assert_eq!(p.tally.invalid[Invalid::IdMismatch.index()], 1);
        assert_eq!(p.tally.invalid[Invalid::BadId.index()], 1);
        assert_eq!(p.tally.invalid_total(), 3);
    }

    #[test]
    fn a_failed_batch_counts_its_points_and_its_offline_statuses() {
        let msgs = vec![
            good("c1", 1),
            good("c2", 2),
            msg("couriers/c3/status", "offline"),
        ];
        let mut p = plan(&msgs, &Validation::default(), NOW);
        p.failed();
        assert_eq!(p.tally.errors, 2);
        assert_eq!(p.tally.status_errors, 1);
    }

    /// The smallest MessagePack reader for what `script_call` writes, to check its layout.
    #[derive(Debug, Clone, PartialEq)]
    enum Mp {
        Str(Vec<u8>),
        Uint(u64),
        F64(f64),
        False,
    }

    fn read_array(b: &[u8]) -> Vec<Mp> {
        let be = |s: &[u8]| s.iter().fold(0u64, |a, &x| (a << 8) | u64::from(x)) as usize;
        let (len, mut i) = match b[0] {
            0x90..=0x9f => ((b[0] & 0x0f) as usize, 1),
            0xdc => (be(&b[1..3]), 3),
            0xdd => (be(&b[1..5]), 5),
            x => panic!("not an array: {x:#x}"),
        };
        let mut out = Vec::with_capacity(len);
        for _ in 0..len {
            let (n, skip) = match b[i] {
                0xa0..=0xbf => ((b[i] & 0x1f) as usize, 1),
                0xd9 => (b[i + 1] as usize, 2),
                0x00..=0x7f => {
                    out.push(Mp::Uint(u64::from(b[i])));
                    i += 1;
                    continue;
                }
                0xcc..=0xcf => {
                    let w = 1 << (b[i] - 0xcc);
                    out.push(Mp::Uint(be(&b[i + 1..i + 1 + w]) as u64));
                    i += 1 + w;
                    continue;
                }
                0xcb => {
                    let bits = u64::from_be_bytes(b[i + 1..i + 9].try_into().unwrap());
                    out.push(Mp::F64(f64::from_bits(bits)));
                    i += 9;
                    continue;
                }
                0xc2 => {
                    out.push(Mp::False);
                    i += 1;
                    continue;
                }
                x => panic!("unexpected {x:#x}"),
            };
            out.push(Mp::Str(b[i + skip..i + skip + n].to_vec()));
            i += skip + n;
        }
        assert_eq!(i, b.len(), "trailing bytes");
        out
    }

    fn s(x: &str) -> Mp {
        Mp::Str(x.as_bytes().to_vec())
    }

    #[test]
    fn args_follow_the_script_layout() {
        // c1's entries go together, in their batch order, under his first place.
        let msgs = vec![
            good("c1", 7),
            good("c2", 3),
            msg("couriers/c1/status", "offline\n"),
            good("c1", 8),
        ];
        let p = plan(&msgs, &Validation::default(), NOW);
        let call = script_call(&p, NOW, 30.0, 0.0);
        assert_eq!(call.args.len(), 4);
        assert_eq!(call.args[0], b"1764460800.0");
        assert_eq!(call.args[1], b"30.0");
        let score = geo_score(46.6, 24.7).to_string();
        let point = |seq| [Mp::Uint(seq), Mp::F64(NOW - 1.0), s(&score)];
        let mut want = vec![s("c1"), Mp::Uint(3)];
        want.extend(point(7));
        want.extend([Mp::False, Mp::False, Mp::False]);
        want.extend(point(8));
        want.extend([s("c2"), Mp::Uint(1)]);
        want.extend(point(3));
        assert_eq!(read_array(&call.args[2]), want);
        assert_eq!(call.couriers(), 2);
        // The exact bytes of one point: the packed form is pinned, not only its meaning.
        let one = script_call(
            &plan(&[good("c1", 7)], &Validation::default(), NOW),
            NOW,
            30.0,
            5.0,
        );
        assert_eq!(one.args[3], b"5.0");
        let mut bytes = vec![0x95, 0xa2, b'c', b'1', 1, 7, 0xcb];
        bytes.extend_from_slice(&(NOW - 1.0).to_bits().to_be_bytes());
        bytes.push(0xa0 | score.len() as u8);
        bytes.extend_from_slice(score.as_bytes());
        assert_eq!(one.args[2], bytes);
    }

    #[test]
    fn reply_parsing() {
        let msgs = vec![
            good("c1", 1),
            good("c2", 5),
            good("c1", 2),
            msg("couriers/c3/status", "offline"),
        ];
        let p = plan(&msgs, &Validation::default(), NOW);
        let call = script_call(&p, NOW, 30.0, 0.0);
        // Judged as c1 (entries 0, 2), c2 (1), c3 (3).
        let codes = |c: &str| Value::BulkString(c.as_bytes().to_vec());
        let order = |o: &str| Value::BulkString(o.as_bytes().to_vec());
        let places = |p: &[Option<&str>]| {
            Value::Array(
                p.iter()
                    .map(|p| p.map_or(Value::Nil, |p| Value::BulkString(p.as_bytes().to_vec())))
                    .collect(),
            )
        };
        let reply = vec![
            codes("1203"),
            Value::Int(1),
            order("o-42,o-43"),
            places(&[None, Some("24.7,46.6||p")]),
        ];
        let carried: Arc<[Carried]> = vec![
            Carried {
                order: "o-42".into(),
                places: None,
            },
            Carried {
                order: "o-43".into(),
                places: Some(Places {
                    pickup: Some((24.7, 46.6)),
                    dropoff: None,
                    pickup_reported: true,
                    dropoff_reported: false,
                }),
            },
        ]
        .into();
        assert_eq!(
            parse_reply(&reply, &call).unwrap(),
            vec![
                Verdict::Accepted {
                    reset: false,
                    orders: Some(carried.clone())
                },
                Verdict::Stale,
                Verdict::Accepted {
                    reset: true,
                    orders: Some(carried)
                },
                Verdict::Offline,
            ]
        );
        assert_eq!(
            parse_reply(&[codes("0110")], &call).unwrap()[1],
            Verdict::Accepted {
                reset: false,
                orders: None
            }
        );
        // An empty order is no order; unreadable places are none.
        assert_eq!(
            parse_reply(
                &[codes("1000"), Value::Int(1), order(""), places(&[])],
                &call
            )
            .unwrap()[0],
            Verdict::Accepted {
                reset: false,
                orders: None
            }
        );
        let odd = parse_reply(
            &[
                codes("1000"),
                Value::Int(1),
                order("o"),
                places(&[Some("nonsense")]),
            ],
            &call,
        )
        .unwrap();
        assert!(
            matches!(&odd[0], Verdict::Accepted { orders: Some(o), .. } if o[0].places.is_none())
        );
        for bad in [
            vec![codes("120")],
            vec![codes("12030")],
            vec![codes("1209")],
            vec![Value::Int(1)],
            vec![],
            vec![codes("1203"), Value::Int(1)],
            vec![codes("1203"), Value::Int(1), order("o")],
            vec![codes("1203"), Value::Int(0), order("o"), Value::Nil],
            vec![codes("1203"), Value::Int(4), order("o"), Value::Nil],
            vec![codes("1203"), Value::Int(1), Value::Int(2), Value::Nil],
            vec![codes("1203"), Value::Int(1), order("o"), Value::Int(2)],
            vec![
                codes("1203"),
                Value::Int(1),
                Value::BulkString(vec![0xff]),
                Value::Nil,
            ],
        ] {
            assert!(parse_reply(&bad, &call).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn geo_scores_are_those_of_redis() {
        // ZSCORE after GEOADD in the Redis documentation's GEOADD example (Sicily).
        assert_eq!(geo_score(13.361389, 38.115556), 3479099956230698);
        assert_eq!(geo_score(15.087269, 37.502669), 3479447370796909);
        // The corners of the GEO range, as GEOADD scores them on Redis 7.0.
        assert_eq!(geo_score(-180.0, -85.05112878), 0);
        assert_eq!(geo_score(180.0, 85.05112878), 3 << 52);
        assert_eq!(interleave(0b11, 0), 0b0101);
        assert_eq!(interleave(0, 0b11), 0b1010);
        assert_eq!(interleave(u32::MAX, u32::MAX), u64::MAX);
    }

    proptest! {
        // Whatever mix of good and bad messages arrives, every loc message is either an entry
        // or counted invalid, and the arguments always have the layout the script reads.
        #[test]
        fn every_point_is_planned_or_counted(
            picks in proptest::collection::vec((0u8..4, any::<Vec<u8>>(), 0u64..1000), 0..200)
        ) {
            let msgs: Vec<Message> = picks.iter().map(|(kind, junk, seq)| match kind {
                0 => good("c1", *seq),
                1 => good(&format!("c{seq}"), *seq),
                2 => Message { topic: "couriers/c1/loc".into(), payload: Bytes::from(junk.clone()), received: NOW },
                _ => msg("couriers/c1/status", "offline"),
            }).collect();
            let loc = msgs.iter().filter(|m| m.topic.ends_with("/loc")).count() as u64;
            let p = plan(&msgs, &Validation::default(), NOW);
            prop_assert_eq!(p.points() + p.tally.invalid_total(), loc);
            // The packed batch lists every entry once, each courier's together and in order.
            let call = script_call(&p, NOW, 30.0, 0.0);
            let v = read_array(&call.args[2]);
            let mut seen = vec![false; p.entries.len()];
            let mut k = 0;
            let mut i = 0;
            let mut couriers = std::collections::HashSet::new();
            while i < v.len() {
                let Mp::Str(id) = &v[i] else { panic!("no id at {i}") };
                let Mp::Uint(n) = v[i + 1] else { panic!("no count at {i}") };
                prop_assert!(couriers.insert(id.clone()), "a courier twice");
                let mut prev = None;
                for e in 0..n as usize {
                    let at = call.judged[k];
                    k += 1;
                    prop_assert!(prev < Some(at));
                    prev = Some(at);
                    seen[at] = true;
                    let f = &v[i + 2 + 3 * e..i + 5 + 3 * e];
                    match &p.entries[at] {
                        Entry::Point { point, .. } => {
                            prop_assert_eq!(point.id.as_bytes(), &id[..]);
                            prop_assert_eq!(&f[0], &Mp::Uint(point.seq));
                            prop_assert_eq!(&f[1], &Mp::F64(point.ts));
                            prop_assert_eq!(&f[2], &s(&geo_score(point.lon, point.lat).to_string()));
                        }
                        Entry::Offline(o) => {
                            prop_assert_eq!(o.as_bytes(), &id[..]);
                            prop_assert!(f.iter().all(|x| *x == Mp::False));
                        }
                    }
                }
                i += 2 + 3 * n as usize;
            }
            prop_assert_eq!(k, p.entries.len());
            prop_assert!(seen.iter().all(|s| *s));
            prop_assert_eq!(call.couriers(), couriers.len());
        }
    }
}
