//! The batch script in real Redis (REDIS_URL; `./dev test` sets it): what Rust packs is what
//! Lua reads, the GEO scores Rust computes are GEOADD's, and the current script gives the same
//! verdicts and leaves the same state as the script before it (`benches/script_v1.lua`), also
//! when it takes over state that script wrote (an upgrade).

#[path = "../benches/v1.rs"]
mod v1;

use bytes::Bytes;
use courier_wire::{Keys, Validation};
use ingest::batch::{self, geo_score, Message, SeqState, Verdict};
use ingest::pack::Packer;
use proptest::prelude::*;
use redis::Value;

const NOW: f64 = 1_764_460_800.0;
fn script() -> &'static str {
    static S: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    S.get_or_init(ingest::sink::batch_lua)
}
const FORGET: &str = include_str!("../src/forget.lua");

fn conn() -> redis::Connection {
    let url = std::env::var("REDIS_URL")
        .expect("these tests need a Redis: set REDIS_URL (./dev test does)");
    redis::Client::open(url)
        .unwrap()
        .get_connection()
        .expect("REDIS_URL unreachable")
}

fn keys() -> Keys {
    Keys::with_prefix(&format!("ts{:016x}:", rand::random::<u64>()))
}

fn cleanup(c: &mut redis::Connection, k: &Keys) {
    let _: () = redis::cmd("DEL")
        .arg(&k.live)
        .arg(&k.seen)
        .arg(&k.order)
        .arg(&k.seq)
        .arg(&k.order_places)
        .arg(&k.order_tenant)
        .arg(&k.events)
        .arg(&k.events_dropped)
        .query(c)
        .unwrap();
}

fn record(k: &Keys) -> String {
    format!("{}{:016x}", k.batch_record, rand::random::<u64>())
}

fn eval(
    c: &mut redis::Connection,
    lua: &str,
    k: &Keys,
    record: &str,
    args: &[Vec<u8>],
) -> Vec<Value> {
    let mut cmd = redis::cmd("EVAL");
    // v1 reads its five keys and ignores the rest; only the current script takes the cap.
    cmd.arg(lua)
        .arg(9)
        .arg(&ingest::sink::batch_keys(k, record))
        .arg(args);
    if lua == script() {
        cmd.arg(1000);
    }
    cmd.query(c).unwrap()
}

/// The position a test point of courier `id` with `seq` and `ts` is at.
fn position(id: &str, seq: u64, ts: f64) -> (f64, f64) {
    let h = id.bytes().map(f64::from).sum::<f64>();
    (
        24.5 + (h * 0.0007 + seq as f64 * 0.00013 + ts * 0.0000017) % 0.5,
        46.5 + (h * 0.0011 + seq as f64 * 0.00031) % 0.5,
    )
}

fn point(id: &str, seq: u64, ts: f64) -> Message {
    let (lat, lon) = position(id, seq, ts);
    Message {
        topic: format!("couriers/{id}/loc"),
        payload: Bytes::from(format!(
            r#"{{"id":"{id}","lat":{lat},"lon":{lon},"ts":{ts},"seq":{seq}}}"#
        )),
        received: NOW,
    }
}

fn offline(id: &str) -> Message {
    Message {
        topic: format!("couriers/{id}/status"),
        payload: Bytes::from_static(b"offline"),
        received: NOW,
    }
}

fn run_current(c: &mut redis::Connection, k: &Keys, msgs: &[Message], now: f64) -> Vec<Verdict> {
    run_every(c, k, msgs, now, 0.0)
}

/// The current script with `seen` written once per bucket of `every` seconds.
fn run_every(
    c: &mut redis::Connection,
    k: &Keys,
    msgs: &[Message],
    now: f64,
    every: f64,
) -> Vec<Verdict> {
    let plan = batch::plan(msgs, &Validation::default(), NOW);
    let call = batch::script_call(&plan, now, 30.0, every);
    let reply = eval(c, script(), k, &record(k), &call.args);
    batch::parse_reply(&reply, &call).unwrap()
}

fn run_v1(c: &mut redis::Connection, k: &Keys, msgs: &[Message], now: f64) -> Vec<Verdict> {
    let plan = batch::plan(msgs, &Validation::default(), NOW);
    let reply = eval(c, v1::LUA, k, &record(k), &v1::args(&plan, now, 30.0));
    v1::parse_reply(&reply)
}

/// What a courier leaves in Redis: GEO score, seen score, seq state.
fn courier_state(
    c: &mut redis::Connection,
    k: &Keys,
    id: &str,
) -> (Option<f64>, Option<f64>, Option<SeqState>) {
    let live: Option<f64> = redis::cmd("ZSCORE").arg(&k.live).arg(id).query(c).unwrap();
    let seen: Option<f64> = redis::cmd("ZSCORE").arg(&k.seen).arg(id).query(c).unwrap();
    let raw: Option<Vec<u8>> = redis::cmd("HGET").arg(&k.seq).arg(id).query(c).unwrap();
    (
        live,
        seen,
        raw.map(|r| SeqState::decode(&r).expect("unreadable seq state")),
    )
}

fn accepted(v: &Verdict) -> bool {
    matches!(v, Verdict::Accepted { .. })
}

#[derive(Debug, Clone)]
enum Val {
    Str(Vec<u8>),
    Uint(u64),
    F64(f64),
    False,
}

fn val() -> impl Strategy<Value = Val> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(Val::Str),
        (0u64..=1 << 53).prop_map(Val::Uint),
        (0u64..300).prop_map(Val::Uint),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Val::F64),
        Just(Val::False),
    ]
}

/// Returns what Lua's cmsgpack.unpack made of the packed array, one tagged string a value.
const UNPACK: &str = r#"
local a = cmsgpack.unpack(ARGV[1])
local out = {}
for i = 1, #a do
  local v = a[i]
  if type(v) == 'string' then out[i] = 's' .. v
  elseif type(v) == 'number' then out[i] = 'n' .. string.format('%.17g', v)
  elseif v == false then out[i] = 'f'
  else out[i] = 'x' .. tostring(v) end
end
return out
"#;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Every form the packer writes is read back by Redis's cmsgpack as the same value.
    #[test]
    fn the_packer_round_trips_through_cmsgpack(vals in proptest::collection::vec(val(), 0..40)) {
        let mut c = conn();
        let mut p = Packer::default();
        p.array(vals.len());
        for v in &vals {
            match v {
                Val::Str(s) => p.str(s),
                Val::Uint(u) => p.uint(*u),
                Val::F64(f) => p.f64(*f),
                Val::False => p.bool(false),
            }
        }
        let got: Vec<Vec<u8>> = redis::cmd("EVAL").arg(UNPACK).arg(0).arg(p.into_bytes()).query(&mut c).unwrap();
        prop_assert_eq!(got.len(), vals.len());
        for (g, v) in got.iter().zip(&vals) {
            let num = || std::str::from_utf8(&g[1..]).unwrap().parse::<f64>().unwrap();
            match v {
                Val::Str(s) => prop_assert_eq!(&g[..], [&b"s"[..], s].concat()),
                Val::Uint(u) => prop_assert_eq!(num(), *u as f64),
                Val::F64(f) => prop_assert_eq!(num().to_bits(), f.to_bits()),
                Val::False => prop_assert_eq!(&g[..], b"f"),
            }
        }
    }

    /// The scores Rust computes are the ones GEOADD stores, so a ZADD of them is a GEOADD.
    #[test]
    fn geo_scores_match_geoadd(points in proptest::collection::vec((-85.05112878f64..=85.05112878, -180f64..=180.0), 1..50)) {
        let mut c = conn();
        let key = format!("ts{:016x}:geo", rand::random::<u64>());
        let mut edges = vec![(85.05112878, 180.0), (-85.05112878, -180.0), (0.0, 0.0), (-0.0, 1e-300)];
        edges.extend(points);
        let mut f = ryu::Buffer::new();
        let mut cmd = redis::cmd("GEOADD");
        cmd.arg(&key);
        for (i, (lat, lon)) in edges.iter().enumerate() {
            cmd.arg(f.format(*lon)).arg(f.format(*lat)).arg(i);
        }
        let _: i64 = cmd.query(&mut c).unwrap();
        for (i, (lat, lon)) in edges.iter().enumerate() {
            let score: f64 = redis::cmd("ZSCORE").arg(&key).arg(i).query(&mut c).unwrap();
            prop_assert_eq!(score, geo_score(*lon, *lat) as f64, "lat {} lon {}", lat, lon);
        }
        let _: () = redis::cmd("DEL").arg(&key).query(&mut c).unwrap();
    }

    /// `SeqState::encode` is the script's `struct.pack('<Bdddd', 1, ...)`, byte for byte.
    #[test]
    fn seq_state_is_the_scripts_struct_pack(v in proptest::array::uniform4(any::<f64>().prop_filter("finite", |f| f.is_finite()))) {
        let mut c = conn();
        let mut f = ryu::Buffer::new();
        let args: Vec<String> = v.iter().map(|x| f.format(*x).to_string()).collect();
        let lua = "return struct.pack('<Bdddd', 1, tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))";
        let got: Vec<u8> = redis::cmd("EVAL").arg(lua).arg(0).arg(&args).query(&mut c).unwrap();
        let st = SeqState { seq: v[0], phone_ts: v[1], epoch_ts: v[2], server_ts: v[3] };
        prop_assert_eq!(&got, &st.encode());
        prop_assert_eq!(SeqState::decode(&got), Some(st));
    }
}

/// One entry of a generated batch: (courier, point or offline, seq, phone-time step).
fn entry() -> impl Strategy<Value = (usize, bool, u64, u64)> {
    (0usize..3, prop::bool::weighted(0.12), 1u64..7, 0u64..7)
}

fn messages(batch: &[(usize, bool, u64, u64)]) -> Vec<Message> {
    const IDS: [&str; 3] = ["ca", "cb", "cc"];
    batch
        .iter()
        .map(|&(c, off, seq, t)| {
            if off {
                offline(IDS[c])
            } else {
                point(IDS[c], seq, NOW - 100.0 + t as f64)
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Random batches (duplicates, lower and higher seqs, older and newer phone times, resets
    /// after 30 s of silence, `offline` statuses, several entries of a courier in one batch):
    /// the current script gives the verdicts v1 gave, one for one, and leaves the same GEO score,
    /// seen time and seq state. A third run lets v1 judge the first batches and the current
    /// script the rest, from the text state v1 left: the same again. A fourth writes `seen`
    /// once per 5 s bucket: the same verdicts, GEO score and seq state, and a `seen` score for
    /// exactly the couriers v1 left one for, in the bucket of v1's (the true last-seen time).
    #[test]
    fn same_verdicts_and_state_as_v1(
        batches in proptest::collection::vec(
            (proptest::collection::vec(entry(), 1..10), prop_oneof![Just(0.0), Just(5.0), Just(31.0), Just(100.0)]),
            1..6),
        split in 0usize..6,
    ) {
        let mut c = conn();
        let (old, new, upgraded, bucketed) = (keys(), keys(), keys(), keys());
        for k in [&old, &new, &upgraded, &bucketed] {
            let _: () = redis::cmd("HSET").arg(&k.order).arg("ca").arg("o-a").query(&mut c).unwrap();
        }
        let mut now = NOW;
        for (i, (batch, dt)) in batches.iter().enumerate() {
            now += dt;
            let msgs = messages(batch);
            let want = run_v1(&mut c, &old, &msgs, now);
            prop_assert_eq!(&run_current(&mut c, &new, &msgs, now), &want, "batch {}", i);
            let up = if i < split {
                run_v1(&mut c, &upgraded, &msgs, now)
            } else {
                run_current(&mut c, &upgraded, &msgs, now)
            };
            prop_assert_eq!(&up, &want, "batch {} after the upgrade at {}", i, split);
            prop_assert_eq!(&run_every(&mut c, &bucketed, &msgs, now, 5.0), &want, "batch {} bucketed", i);
            for id in ["ca", "cb", "cc"] {
                let (live, seen, st) = courier_state(&mut c, &old, id);
                let (b_live, b_seen, b_st) = courier_state(&mut c, &bucketed, id);
                prop_assert_eq!((b_live, b_st), (live, st), "{} bucketed", id);
                prop_assert_eq!(b_seen.map(|s| (s / 5.0).floor()), seen.map(|s| (s / 5.0).floor()), "{} seen bucket", id);
            }
        }
        for id in ["ca", "cb", "cc"] {
            let want = courier_state(&mut c, &old, id);
            prop_assert_eq!(courier_state(&mut c, &new, id), want, "{}", id);
            prop_assert_eq!(courier_state(&mut c, &upgraded, id), want, "{} upgraded", id);
        }
        for k in [&old, &new, &upgraded, &bucketed] {
            cleanup(&mut c, k);
        }
    }
}

/// The rule table of docs/rules.md, row by row, on one courier.
#[test]
fn the_rule_table() {
    let mut c = conn();
    let k = keys();
    let t = NOW - 100.0;
    let run =
        |c: &mut redis::Connection, m: Message, now: f64| run_current(c, &k, &[m], now)[0].clone();
    let yes = Verdict::Accepted {
        reset: false,
        orders: None,
    };
    let reset = Verdict::Accepted {
        reset: true,
        orders: None,
    };
    // 1. no state: accepted, a new epoch at t.
    assert_eq!(run(&mut c, point("r", 500, t), NOW), yes);
    // 2. higher seq, phone time not before the epoch.
    assert_eq!(run(&mut c, point("r", 501, t + 1.0), NOW), yes);
    // Duplicate, lower seq with older phone time: stale.
    assert_eq!(run(&mut c, point("r", 501, t + 1.0), NOW), Verdict::Stale);
    assert_eq!(run(&mut c, point("r", 400, t - 1.0), NOW), Verdict::Stale);
    // 3. lower seq, newer phone time: stale within reset_after (30 s) of the last acceptance...
    assert_eq!(
        run(&mut c, point("r", 1, t + 10.0), NOW + 29.0),
        Verdict::Stale
    );
    // ...a reset once the courier was silent that long; the new epoch starts at t + 10.
    assert_eq!(run(&mut c, point("r", 1, t + 10.0), NOW + 30.0), reset);
    let (_, seen, st) = courier_state(&mut c, &k, "r");
    assert_eq!(seen, Some(NOW + 30.0));
    assert_eq!(
        st,
        Some(SeqState {
            seq: 1.0,
            phone_ts: t + 10.0,
            epoch_ts: t + 10.0,
            server_ts: NOW + 30.0
        })
    );
    // A replay of the old install: higher seq, phone time before the new epoch: stale.
    assert_eq!(
        run(&mut c, point("r", 502, t + 2.0), NOW + 31.0),
        Verdict::Stale
    );
    assert_eq!(run(&mut c, point("r", 2, t + 11.0), NOW + 31.0), yes);
    let (lat, lon) = position("r", 2, t + 11.0);
    let (live, _, _) = courier_state(&mut c, &k, "r");
    assert_eq!(live, Some(geo_score(lon, lat) as f64));
    cleanup(&mut c, &k);
}

/// Several entries of one courier in one batch: each judged against the one before, only the
/// last accepted position written, an `offline` after it removes him, one before it does not.
#[test]
fn a_couriers_entries_in_one_batch() {
    let mut c = conn();
    let k = keys();
    let t = NOW - 100.0;
    let _: () = redis::cmd("HSET")
        .arg(&k.order)
        .arg("m")
        .arg("o-m")
        .query(&mut c)
        .unwrap();
    let msgs = vec![
        point("m", 5, t),
        point("n", 1, t),
        point("m", 7, t + 2.0),
        point("m", 6, t + 1.0),
        point("m", 7, t + 2.0),
        point("m", 8, t + 3.0),
    ];
    let v = run_current(&mut c, &k, &msgs, NOW);
    let order = |o: Option<&str>| Verdict::Accepted {
        reset: false,
        orders: o.map(|o| {
            vec![batch::Carried {
                order: o.to_string(),
                places: None,
            }]
            .into()
        }),
    };
    assert_eq!(
        v,
        vec![
            order(Some("o-m")),
            order(None),
            order(Some("o-m")),
            Verdict::Stale,
            Verdict::Stale,
            order(Some("o-m"))
        ]
    );
    let (lat, lon) = position("m", 8, t + 3.0);
    assert_eq!(
        courier_state(&mut c, &k, "m").0,
        Some(geo_score(lon, lat) as f64)
    );
    // Accepted, then offline: gone. Offline, then accepted: live.
    let v = run_current(
        &mut c,
        &k,
        &[
            point("m", 9, t + 4.0),
            offline("m"),
            offline("n"),
            point("n", 2, t + 1.0),
        ],
        NOW,
    );
    assert_eq!(
        v,
        vec![
            order(Some("o-m")),
            Verdict::Offline,
            Verdict::Offline,
            order(None)
        ]
    );
    let (live, seen, st) = courier_state(&mut c, &k, "m");
    assert_eq!((live, seen), (None, None));
    assert_eq!(st.unwrap().seq, 9.0, "offline keeps the seq state");
    assert!(courier_state(&mut c, &k, "n").0.is_some());
    cleanup(&mut c, &k);
}

/// State written by the script before the packed form (text) is read: no courier loses his
/// seq when a deployment upgrades, and his next accepted point stores the packed form.
#[test]
fn text_state_of_the_previous_version_is_read() {
    let mut c = conn();
    let k = keys();
    let t = NOW - 100.0;
    let text = format!("500|{}|{}|{}", t, t - 50.0, NOW - 10.0);
    let _: () = redis::cmd("HSET")
        .arg(&k.seq)
        .arg("u")
        .arg(&text)
        .arg("w")
        .arg(&text)
        .arg("x")
        .arg("garbage")
        .query(&mut c)
        .unwrap();
    let yes = Verdict::Accepted {
        reset: false,
        orders: None,
    };
    let v = run_current(
        &mut c,
        &k,
        &[
            point("u", 499, t - 1.0),
            point("w", 1, t + 5.0),
            point("x", 1, t - 60.0),
        ],
        NOW,
    );
    // Older than the stored seq: stale. Lower seq, newer time, 10 s after: stale (no reset
    // yet). Unreadable state: taken as none.
    assert_eq!(v, vec![Verdict::Stale, Verdict::Stale, yes.clone()]);
    let v = run_current(
        &mut c,
        &k,
        &[point("u", 501, t - 49.0), point("w", 1, t + 5.0)],
        NOW + 20.0,
    );
    assert_eq!(
        v,
        vec![
            yes,
            Verdict::Accepted {
                reset: true,
                orders: None
            }
        ]
    );
    let raw: Vec<u8> = redis::cmd("HGET")
        .arg(&k.seq)
        .arg("u")
        .query(&mut c)
        .unwrap();
    assert_eq!(raw.len(), SeqState::PACKED_LEN);
    assert_eq!(
        SeqState::decode(&raw),
        Some(SeqState {
            seq: 501.0,
            phone_ts: t - 49.0,
            epoch_ts: t - 50.0,
            server_ts: NOW + 20.0
        })
    );
    cleanup(&mut c, &k);
}

/// What docs/rules.md says of a mixed window or a downgrade: v1 reads a packed state as none
/// (the courier's next point is accepted as a new epoch, once) and then writes its text, which
/// the current script reads again.
#[test]
fn v1_reads_packed_state_as_none() {
    let mut c = conn();
    let k = keys();
    let t = NOW - 100.0;
    let yes = Verdict::Accepted {
        reset: false,
        orders: None,
    };
    assert_eq!(
        run_current(&mut c, &k, &[point("d", 5, t)], NOW),
        vec![yes.clone()]
    );
    assert_eq!(
        run_v1(&mut c, &k, &[point("d", 3, t - 1.0)], NOW + 1.0),
        vec![yes]
    );
    let (_, _, st) = courier_state(&mut c, &k, "d");
    assert_eq!(st.unwrap().seq, 3.0);
    assert_eq!(
        run_current(&mut c, &k, &[point("d", 2, t - 2.0)], NOW + 2.0),
        vec![Verdict::Stale]
    );
    cleanup(&mut c, &k);
}

/// A batch retried after a response timeout (Redis had applied its first run) gets the reply of
/// that run: accepted, with the courier's order. Judged again it would be stale. Another record
/// is judged afresh, and the record lives 30 s.
#[test]
fn a_retried_batch_gets_the_reply_of_its_first_run() {
    let mut c = conn();
    let k = keys();
    let _: () = redis::cmd("HSET")
        .arg(&k.order)
        .arg("rb")
        .arg("ord-rb")
        .query(&mut c)
        .unwrap();
    let msgs = [point("rb", 7, NOW - 1.0), offline("other")];
    let plan = batch::plan(&msgs, &Validation::default(), NOW);
    let call = batch::script_call(&plan, NOW, 30.0, 0.0);
    let rec = record(&k);
    let first = batch::parse_reply(&eval(&mut c, script(), &k, &rec, &call.args), &call).unwrap();
    let again = batch::parse_reply(&eval(&mut c, script(), &k, &rec, &call.args), &call).unwrap();
    let other =
        batch::parse_reply(&eval(&mut c, script(), &k, &record(&k), &call.args), &call).unwrap();
    let yes = Verdict::Accepted {
        reset: false,
        orders: Some(
            vec![batch::Carried {
                order: "ord-rb".into(),
                places: None,
            }]
            .into(),
        ),
    };
    assert_eq!(first, vec![yes.clone(), Verdict::Offline]);
    assert_eq!(again, first, "the retry was judged again");
    assert_eq!(other, vec![Verdict::Stale, Verdict::Offline]);
    let ttl: i64 = redis::cmd("TTL").arg(&rec).query(&mut c).unwrap();
    assert!((1..=30).contains(&ttl), "ttl {ttl}");
    let _: () = redis::cmd("DEL").arg(&rec).query(&mut c).unwrap();
    cleanup(&mut c, &k);
}

/// The largest batch ingest may send (batch_max at most 2000), every point a courier of its own.
#[test]
fn a_full_batch_of_distinct_couriers() {
    let mut c = conn();
    let k = keys();
    let msgs: Vec<Message> = (0..2000)
        .map(|i| point(&format!("f{i}"), 1, NOW - 5.0))
        .collect();
    let v = run_current(&mut c, &k, &msgs, NOW);
    assert!(v.iter().all(accepted));
    let n: u64 = redis::cmd("ZCARD").arg(&k.live).query(&mut c).unwrap();
    let s: u64 = redis::cmd("HLEN").arg(&k.seq).query(&mut c).unwrap();
    assert_eq!((n, s), (2000, 2000));
    cleanup(&mut c, &k);
}

/// The forget sweep reads both forms: state whose last acceptance is before the cutoff goes,
/// newer stays, unreadable goes.
#[test]
fn forget_reads_packed_and_text_state() {
    let mut c = conn();
    let k = keys();
    let packed = |server_ts| {
        SeqState {
            seq: 1.0,
            phone_ts: 1.0,
            epoch_ts: 1.0,
            server_ts,
        }
        .encode()
    };
    let _: () = redis::cmd("HSET")
        .arg(&k.seq)
        .arg("p-old")
        .arg(packed(NOW - 100.0))
        .arg("p-new")
        .arg(packed(NOW))
        .arg("t-old")
        .arg(format!("1|1|1|{}", NOW - 100.0))
        .arg("t-new")
        .arg(format!("1|1|1|{NOW}"))
        .arg("junk")
        .arg("junk")
        .query(&mut c)
        .unwrap();
    let (cursor, removed): (String, u64) = redis::cmd("EVAL")
        .arg(FORGET)
        .arg(1)
        .arg(&k.seq)
        .arg(0)
        .arg(NOW - 50.0)
        .arg(100)
        .query(&mut c)
        .unwrap();
    assert_eq!((cursor.as_str(), removed), ("0", 3));
    let mut left: Vec<String> = redis::cmd("HKEYS").arg(&k.seq).query(&mut c).unwrap();
    left.sort();
    assert_eq!(left, ["p-new", "t-new"]);
    cleanup(&mut c, &k);
}

/// Runs the eviction sweep once at `now` (cutoff `now - ttl`); returns (evicted, examined).
fn sweep(c: &mut redis::Connection, k: &Keys, now: f64, ttl: f64) -> (u64, u64) {
    redis::cmd("EVAL")
        .arg(ingest::sink::evict_lua())
        .arg(7)
        .arg(&k.live)
        .arg(&k.seen)
        .arg(&k.order)
        .arg(&k.order_tenant)
        .arg(&k.events)
        .arg(&k.events_dropped)
        .arg(&k.seq)
        .arg(now - ttl)
        .arg(1000)
        .arg(100)
        .arg(now)
        .query(c)
        .unwrap()
}

fn is_live(c: &mut redis::Connection, k: &Keys, id: &str) -> bool {
    let s: Option<f64> = redis::cmd("ZSCORE").arg(&k.live).arg(id).query(c).unwrap();
    s.is_some()
}

/// `seen` once per bucket (docs/rules.md, "Eviction"): within a 5 s bucket only the first
/// accepted point writes it, the seq state always holds the exact time; an `offline` (tag 2)
/// makes the next point write it even within the same bucket.
#[test]
fn seen_is_written_once_per_bucket() {
    let mut c = conn();
    let k = keys();
    let t = NOW - 100.0;
    let mut seq = 0;
    let mut send = |c: &mut redis::Connection, now: f64| {
        seq += 1;
        run_every(c, &k, &[point("b", seq, t + seq as f64)], now, 5.0)
    };
    let tag = |c: &mut redis::Connection| {
        let raw: Vec<u8> = redis::cmd("HGET").arg(&k.seq).arg("b").query(c).unwrap();
        raw[0]
    };
    send(&mut c, NOW + 1.0);
    send(&mut c, NOW + 2.5);
    send(&mut c, NOW + 4.9);
    let (_, seen, st) = courier_state(&mut c, &k, "b");
    assert_eq!(seen, Some(NOW + 1.0), "first point of the bucket");
    assert_eq!(
        st.unwrap().server_ts,
        NOW + 4.9,
        "the state holds the true time"
    );
    assert_eq!(tag(&mut c), SeqState::TAG);
    send(&mut c, NOW + 5.0);
    assert_eq!(
        courier_state(&mut c, &k, "b").1,
        Some(NOW + 5.0),
        "a new bucket"
    );
    // offline, then a point in the same bucket: listed again.
    run_every(&mut c, &k, &[offline("b")], NOW + 6.0, 5.0);
    assert_eq!(tag(&mut c), SeqState::OFFLINE_TAG);
    assert_eq!(courier_state(&mut c, &k, "b").1, None);
    assert!(!is_live(&mut c, &k, "b"));
    send(&mut c, NOW + 7.0);
    let (live, seen, _) = courier_state(&mut c, &k, "b");
    assert!(live.is_some());
    assert_eq!(seen, Some(NOW + 7.0));
    assert_eq!(tag(&mut c), SeqState::TAG);
    // 0: every point.
    run_every(&mut c, &k, &[point("b", 100, t + 100.0)], NOW + 8.0, 0.0);
    assert_eq!(courier_state(&mut c, &k, "b").1, Some(NOW + 8.0));
    cleanup(&mut c, &k);
}

/// The eviction rule of evict.lua, row by row: a candidate from `seen` is evicted only when
/// his state confirms he is silent (or has no state), else re-scored to his true time.
#[test]
fn eviction_confirms_against_the_state() {
    let mut c = conn();
    let k = keys();
    let state = |server_ts: f64| {
        SeqState {
            seq: 1.0,
            phone_ts: 1.0,
            epoch_ts: 1.0,
            server_ts,
        }
        .encode()
    };
    for (id, seen) in [
        ("silent", NOW - 70.0),
        ("lagged", NOW - 62.0),
        ("none", NOW - 70.0),
        ("text", NOW - 61.0),
        ("fresh", NOW - 10.0),
    ] {
        let _: () = redis::cmd("ZADD")
            .arg(&k.live)
            .arg(1)
            .arg(id)
            .query(&mut c)
            .unwrap();
        let _: () = redis::cmd("ZADD")
            .arg(&k.seen)
            .arg(seen)
            .arg(id)
            .query(&mut c)
            .unwrap();
    }
    let _: () = redis::cmd("HSET")
        .arg(&k.seq)
        .arg("silent")
        .arg(state(NOW - 66.0))
        .arg("lagged")
        .arg(state(NOW - 58.0))
        .arg("text")
        .arg(format!("1|1|1|{}", NOW - 59.0))
        .arg("fresh")
        .arg(state(NOW - 9.0))
        .query(&mut c)
        .unwrap();
    assert_eq!(sweep(&mut c, &k, NOW, 60.0), (2, 4));
    for (id, live, seen) in [
        ("silent", false, None),
        ("none", false, None),
        ("lagged", true, Some(NOW - 58.0)),
        ("text", true, Some(NOW - 59.0)),
        ("fresh", true, Some(NOW - 10.0)),
    ] {
        assert_eq!(is_live(&mut c, &k, id), live, "{id}");
        assert_eq!(courier_state(&mut c, &k, id).1, seen, "{id}");
    }
    // The re-scored are past the cutoff: the next sweep examines none of them.
    assert_eq!(sweep(&mut c, &k, NOW, 60.0), (0, 0));
    cleanup(&mut c, &k);
}

/// With `seen` once per 5 s bucket and a sweep every 5 s (TTL 60 s), simulated over ten
/// minutes: a courier sending every second (or every 4 s) is never evicted; one that goes
/// silent is evicted at the first sweep after his last point + TTL (so within TTL + the sweep
/// period, exact to the sweep), never before; sending again lists him again. The re-scored
/// count shows that the sweep met lagging `seen` scores.
#[test]
fn eviction_with_seen_once_per_bucket() {
    let mut c = conn();
    let k = keys();
    let (ttl, every, period) = (60.0, 5.0, 5.0);
    let mut seqs = std::collections::HashMap::new();
    let mut last = std::collections::HashMap::new();
    // (courier, interval s, stops sending at s after start)
    let couriers = [
        ("every1", 1.0, 1e9),
        ("every4", 4.0, 1e9),
        ("stops", 1.0, 123.4),
        ("stops4", 4.0, 200.0),
        ("back", 2.0, 50.0),
    ];
    let mut t = 0.0;
    let mut rescored = 0;
    while t < 600.0 {
        t += 0.5;
        let now = NOW + t;
        for (id, interval, stop) in couriers {
            let back = id == "back" && t >= 300.0;
            if (t < stop || back) && (t % interval) == 0.0 {
                let s = seqs.entry(id).or_insert(0u64);
                *s += 1;
                let v = run_every(
                    &mut c,
                    &k,
                    &[point(id, *s, NOW - 1.0 + t / 1000.0)],
                    now,
                    every,
                );
                assert!(accepted(&v[0]), "{id} at {t}");
                last.insert(id, now);
            }
        }
        // Off the buckets' edges, so some sweeps find a `seen` score that lags (re-scored).
        if t % period == period / 2.0 {
            let (evicted, examined) = sweep(&mut c, &k, now, ttl);
            rescored += examined - evicted;
            for (id, _, _) in couriers {
                let Some(at) = last.get(id) else { continue };
                let silent_for = now - at;
                assert_eq!(
                    is_live(&mut c, &k, id),
                    silent_for <= ttl,
                    "{id} at {t}, silent {silent_for}"
                );
                if silent_for <= ttl {
                    let (_, seen, st) = courier_state(&mut c, &k, id);
                    let lag = st.unwrap().server_ts - seen.expect("listed");
                    assert!((0.0..every).contains(&lag), "{id} at {t}: seen lags {lag}");
                }
            }
        }
    }
    assert!(rescored > 0, "no sweep met a lagging score");
    cleanup(&mut c, &k);
}
