//! The pure core of a batch: received messages in, script arguments and verdicts out. No I/O,
//! so validation, the argument layout and reply parsing are tested without Redis.

use crate::events::Tally;
use bytes::Bytes;
use courier_wire::{decode_point, parse_courier_topic, CourierTopic, Invalid, Point, Validation};

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
    pub fn points(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| matches!(e, Entry::Point { .. }))
            .count() as u64
    }

    /// The batch did not reach Redis: its points are errors, and so are its `offline` statuses
    /// (those couriers stay live until the eviction sweep): counted, not forgotten.
    pub fn failed(&mut self) {
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

/// The script's arguments after the keys: `now`, `reset_after`, then five per entry.
pub fn script_args(plan: &Plan<'_>, now: f64, reset_after_secs: f64) -> Vec<String> {
    let mut f = ryu::Buffer::new();
    let mut args = Vec::with_capacity(2 + plan.entries.len() * 5);
    args.push(f.format(now).to_string());
    args.push(f.format(reset_after_secs).to_string());
    for e in &plan.entries {
        match e {
            Entry::Point { point, .. } => {
                args.push(point.id.to_string());
                args.push(f.format(point.lon).to_string());
                args.push(f.format(point.lat).to_string());
                args.push(point.seq.to_string());
                args.push(f.format(point.ts).to_string());
            }
            Entry::Offline(id) => {
                args.extend([
                    id.to_string(),
                    String::new(),
                    String::new(),
                    "off".into(),
                    String::new(),
                ]);
            }
        }
    }
    args
}

/// The script's decision on one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Stale,
    /// Became the last location; `reset` when it restarted the courier's seq.
    Accepted {
        reset: bool,
        order: Option<String>,
    },
    Offline,
}

/// Reads the script's flat reply (`code, order` per entry).
pub fn parse_reply(reply: &[redis::Value], entries: usize) -> Result<Vec<Verdict>, String> {
    use redis::Value;
    if reply.len() != entries * 2 {
        return Err(format!(
            "batch script returned {} values for {entries} entries",
            reply.len()
        ));
    }
    reply
        .chunks_exact(2)
        .map(|pair| {
            let code = match &pair[0] {
                Value::Int(c) => *c,
                other => return Err(format!("unexpected code {other:?}")),
            };
            let order = match &pair[1] {
                Value::BulkString(b) if !b.is_empty() => Some(
                    String::from_utf8(b.clone())
                        .map_err(|_| "order id is not UTF-8".to_string())?,
                ),
                Value::BulkString(_) | Value::Nil => None,
                other => return Err(format!("unexpected order {other:?}")),
            };
            match code {
                0 => Ok(Verdict::Stale),
                1 | 2 => Ok(Verdict::Accepted {
                    reset: code == 2,
                    order,
                }),
                3 => Ok(Verdict::Offline),
                c => Err(format!("unknown verdict code {c}")),
            }
        })
        .collect()
}

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

    #[test]
    fn args_follow_the_script_layout() {
        let msgs = vec![good("c1", 7), msg("couriers/c1/status", "offline\n")];
        let p = plan(&msgs, &Validation::default(), NOW);
        let a = script_args(&p, NOW, 30.0);
        assert_eq!(
            a,
            vec![
                "1764460800.0",
                "30.0",
                "c1",
                "46.6",
                "24.7",
                "7",
                "1764460799.0",
                "c1",
                "",
                "",
                "off",
                ""
            ]
        );
    }

    #[test]
    fn reply_parsing() {
        let reply = vec![
            Value::Int(1),
            Value::BulkString(b"o-42".to_vec()),
            Value::Int(0),
            Value::BulkString(vec![]),
            Value::Int(2),
            Value::BulkString(vec![]),
            Value::Int(3),
            Value::BulkString(vec![]),
        ];
        assert_eq!(
            parse_reply(&reply, 4).unwrap(),
            vec![
                Verdict::Accepted {
                    reset: false,
                    order: Some("o-42".into())
                },
                Verdict::Stale,
                Verdict::Accepted {
                    reset: true,
                    order: None
                },
                Verdict::Offline,
            ]
        );
        assert!(parse_reply(&reply, 3).is_err());
        assert!(parse_reply(&[Value::Int(9), Value::Nil], 1).is_err());
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
            prop_assert_eq!(script_args(&p, NOW, 30.0).len(), 2 + 5 * p.entries.len());
        }
    }
}
