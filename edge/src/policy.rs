//! The courier policy, pure (no socket, no clock: times are passed in): who may log in, and
//! what a phone logged in as courier X may send. Every "no" is a [`Refusal`] with a metric label.
//!
//! | packet | allowed | otherwise |
//! |---|---|---|
//! | CONNECT | username = courier id, password = a `courier` token for that id, not expired; Will (if any) on `couriers/<id>/status`, not retained, QoS <= 1 | CONNACK 3.1.1 code 4 / MQTT 5 0x86 (bad token, or any other audience's: signed with a key the edge does not hold), code 5 / 0x87 (valid token, wrong id, or a bad Will) |
//! | PUBLISH | `couriers/<id>/loc` or `couriers/<id>/status`, QoS 0 or 1, not retained, no topic alias | MQTT 5: PUBACK 0x87 (QoS 1, wrong topic), else DISCONNECT 0x87 / 0x9A retain / 0x9B QoS 2; 3.1.1: close |
//! | SUBSCRIBE | nothing (a phone reads nothing) | SUBACK failure for every filter |
//! | more points than the bucket holds | - | dropped and counted, connection kept |

use crate::codec::{ConnectOutcome, Publish, Will};
use courier_auth::{TokenError, Verifier};
use courier_wire::topic::valid_id;
use courier_wire::{parse_courier_topic, CourierTopic};

/// Why the edge said no. `reason()` is the `reason` label of `edge_refusals_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No password, or a token that is malformed, forged, signed with an unknown key.
    BadToken,
    /// The token has expired (at CONNECT, or while connected: then the phone is disconnected).
    ExpiredToken,
    /// A valid token for another courier, or of another kind (service, support, viewer).
    WrongCourier,
    /// A Last Will on a topic other than the courier's own status, retained, or QoS 2.
    Will,
    /// A PUBLISH on a topic other than the courier's own two.
    Topic,
    /// A retained PUBLISH.
    Retain,
    /// A QoS 2 PUBLISH.
    Qos,
    /// A SUBSCRIBE filter (phones read nothing).
    Subscribe,
    /// Not MQTT, a malformed packet, a second CONNECT, a topic alias.
    Protocol,
    /// A packet over the size limit (checked from its header, before buffering it).
    TooLarge,
    /// No CONNECT within the connect timeout, or silent past its keep-alive.
    Timeout,
    /// The process holds `max_connections` already.
    Full,
    /// TLS handshake failed or timed out, or too many were in progress.
    Tls,
    /// WebSocket upgrade refused (wrong path or subprotocol) or failed.
    WebSocket,
}

impl Refusal {
    pub(crate) const ALL: [Refusal; 14] = [
        Refusal::BadToken,
        Refusal::ExpiredToken,
        Refusal::WrongCourier,
        Refusal::Will,
        Refusal::Topic,
        Refusal::Retain,
        Refusal::Qos,
        Refusal::Subscribe,
        Refusal::Protocol,
        Refusal::TooLarge,
        Refusal::Timeout,
        Refusal::Full,
        Refusal::Tls,
        Refusal::WebSocket,
    ];

    /// The `reason` label.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refusal::BadToken => "bad_token",
            Refusal::ExpiredToken => "expired_token",
            Refusal::WrongCourier => "wrong_courier",
            Refusal::Will => "will",
            Refusal::Topic => "topic",
            Refusal::Retain => "retain",
            Refusal::Qos => "qos",
            Refusal::Subscribe => "subscribe",
            Refusal::Protocol => "protocol",
            Refusal::TooLarge => "too_large",
            Refusal::Timeout => "timeout",
            Refusal::Full => "full",
            Refusal::Tls => "tls",
            Refusal::WebSocket => "websocket",
        }
    }
}

/// A courier whose CONNECT was accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Login {
    pub courier: Box<str>,
    /// Token expiry, unix seconds: the session ends then.
    pub expires: u64,
    /// The Will, already checked: it can only be `couriers/<id>/status`.
    pub will: Option<Bytes>,
}

use bytes::Bytes;

/// Checks a CONNECT: the courier's device token under his id, and his Will.
pub(crate) fn connect(
    keys: &Verifier,
    username: Option<&str>,
    password: Option<&str>,
    will: Option<Will>,
    now: u64,
) -> Result<Login, (ConnectOutcome, Refusal)> {
    let bad = |r| (ConnectOutcome::BadCredentials, r);
    let denied = |r| (ConnectOutcome::NotAuthorized, r);
    let (Some(user), Some(pass)) = (username, password) else {
        return Err(bad(Refusal::BadToken));
    };
    // `keys` hold the courier audience's keys only: a viewer, trail or bus token is signed
    // with another audience's key and fails here as an unknown key.
    let claims = keys.verify(pass, now).map_err(|e| match e {
        TokenError::Expired => bad(Refusal::ExpiredToken),
        TokenError::WrongAudience => denied(Refusal::WrongCourier),
        _ => bad(Refusal::BadToken),
    })?;
    if claims.sub != user || !valid_id(user) {
        return Err(denied(Refusal::WrongCourier));
    }
    let will = match will {
        None => None,
        Some(w) => {
            let own = matches!(parse_courier_topic(&w.topic), Some(CourierTopic::Status(id)) if id == user);
            if !own || w.retain || w.qos > 1 {
                return Err(denied(Refusal::Will));
            }
            // A copy: the decoded payload is a slice of the whole CONNECT packet (token
            // included), which would otherwise stay allocated for the whole session.
            Some(Bytes::copy_from_slice(&w.payload))
        }
    };
    Ok(Login {
        courier: user.into(),
        expires: claims.exp,
        will,
    })
}

/// What to do with a PUBLISH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it to the bus (a point or a status of the courier himself).
    Forward,
    /// Refuse it: see [`Refusal`]; the session decides how to tell the client.
    Refuse(Refusal),
}

/// What a forwarded PUBLISH says about the courier's shift. Only his own explicit statuses
/// count: the `offline` Will the edge publishes for a lost connection is not the end of a shift.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shift {
    /// A point: dropped at the door while he is off shift.
    Point,
    /// `online`: a shift starts (points go through again).
    Starts,
    /// `offline`: his shift ends; his points are dropped until the next `online`.
    Ends,
    /// Another status.
    Other,
}

/// The shift meaning of a PUBLISH that [`publish`] lets through.
pub(crate) fn shift(p: &Publish) -> Shift {
    match parse_courier_topic(&p.topic) {
        Some(CourierTopic::Loc(_)) => Shift::Point,
        Some(CourierTopic::Status(_)) => match p.payload.trim_ascii() {
            b"online" => Shift::Starts,
            b"offline" => Shift::Ends,
            _ => Shift::Other,
        },
        None => Shift::Other,
    }
}

/// Checks a PUBLISH of the courier `me`.
pub fn publish(me: &str, p: &Publish) -> Verdict {
    if p.topic_alias {
        return Verdict::Refuse(Refusal::Protocol);
    }
    if p.qos > 1 {
        return Verdict::Refuse(Refusal::Qos);
    }
    let own = match parse_courier_topic(&p.topic) {
        Some(CourierTopic::Loc(id) | CourierTopic::Status(id)) => id == me,
        None => false,
    };
    if !own {
        return Verdict::Refuse(Refusal::Topic);
    }
    if p.retain {
        return Verdict::Refuse(Refusal::Retain);
    }
    Verdict::Forward
}

/// A token bucket: `rate` tokens a second up to `burst`; a point takes one. Generous defaults
/// let a phone replay its offline backlog at once; a stolen token cannot flood the bus.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Bucket {
    tokens: f32,
    /// Seconds (of the caller's clock) when `tokens` was last brought up to date.
    at: f64,
}

/// Rate limit settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub per_second: f32,
    pub burst: f32,
}

impl Bucket {
    /// A full bucket at time `now` (seconds).
    pub(crate) fn full(rate: Rate, now: f64) -> Self {
        Bucket {
            tokens: rate.burst,
            at: now,
        }
    }

    /// Takes one token at `now` (seconds, never going back): `false` when empty.
    pub(crate) fn take(&mut self, rate: Rate, now: f64) -> bool {
        let dt = (now - self.at).max(0.0) as f32;
        self.tokens = (self.tokens + dt * rate.per_second).min(rate.burst);
        self.at = now.max(self.at);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use courier_auth::{Audience, Claims, SigningKey};
    use proptest::prelude::*;

    fn signer() -> &'static SigningKey {
        static KEY: std::sync::OnceLock<SigningKey> = std::sync::OnceLock::new();
        KEY.get_or_init(|| SigningKey::generate(Audience::Courier).unwrap())
    }

    fn keys() -> Verifier {
        Verifier::new(Audience::Courier, [signer().public().clone()]).unwrap()
    }

    fn token(id: &str, exp_in: u64) -> String {
        signer().sign(&Claims::courier(id, 1000, exp_in))
    }

    fn will(topic: &str) -> Will {
        Will {
            topic: topic.into(),
            payload: Bytes::from_static(b"offline"),
            qos: 0,
            retain: false,
        }
    }

    fn publish_on(topic: &str) -> Publish {
        Publish {
            topic: topic.into(),
            payload: Bytes::from_static(b"{}"),
            qos: 0,
            retain: false,
            pkid: 0,
            topic_alias: false,
        }
    }

    #[test]
    fn only_his_own_explicit_statuses_move_his_shift() {
        let with = |topic: &str, payload: &'static [u8]| Publish {
            payload: Bytes::from_static(payload),
            ..publish_on(topic)
        };
        assert_eq!(shift(&with("couriers/c1/loc", b"{}")), Shift::Point);
        assert_eq!(shift(&with("couriers/c1/status", b"offline")), Shift::Ends);
        assert_eq!(
            shift(&with("couriers/c1/status", b" online\n")),
            Shift::Starts
        );
        assert_eq!(shift(&with("couriers/c1/status", b"busy")), Shift::Other);
        assert_eq!(
            shift(&with("couriers/c1/status", b"offline-ish")),
            Shift::Other
        );
    }

    #[test]
    fn a_courier_logs_in_as_himself_with_his_own_will() {
        let t = token("c1", 3600);
        let l = connect(
            &keys(),
            Some("c1"),
            Some(&t),
            Some(will("couriers/c1/status")),
            1500,
        )
        .unwrap();
        assert_eq!(&*l.courier, "c1");
        assert_eq!(l.expires, 4600);
        assert_eq!(l.will.as_deref(), Some(&b"offline"[..]));
    }

    #[test]
    fn connect_refusals_by_reason_and_code() {
        use ConnectOutcome::*;
        let k = keys();
        let t = token("c1", 3600);
        let c = |u: Option<&str>, p: Option<&str>, w: Option<Will>, now| {
            connect(&k, u, p, w, now).unwrap_err()
        };
        assert_eq!(
            c(None, None, None, 1500),
            (BadCredentials, Refusal::BadToken)
        );
        assert_eq!(
            c(Some("c1"), None, None, 1500),
            (BadCredentials, Refusal::BadToken)
        );
        assert_eq!(
            c(Some("c1"), Some("garbage"), None, 1500),
            (BadCredentials, Refusal::BadToken)
        );
        let forged = SigningKey::generate(Audience::Courier)
            .unwrap()
            .sign(&Claims::courier("c1", 1000, 3600));
        assert_eq!(
            c(Some("c1"), Some(&forged), None, 1500),
            (BadCredentials, Refusal::BadToken)
        );
        assert_eq!(
            c(Some("c1"), Some(&t), None, 4600),
            (BadCredentials, Refusal::ExpiredToken)
        );
        // Valid token, someone else's id.
        assert_eq!(
            c(Some("c2"), Some(&t), None, 1500),
            (NotAuthorized, Refusal::WrongCourier)
        );
        // A worker's token is no phone login: signed with the bus key, unknown here...
        let bus = SigningKey::generate(Audience::Bus).unwrap();
        let svc = bus.sign(&Claims::bus("ingest", 1000, 3600));
        assert_eq!(
            c(Some("ingest"), Some(&svc), None, 1500),
            (BadCredentials, Refusal::BadToken)
        );
        // ...and were the courier key misused to sign one, its audience is still not courier.
        let svc = signer().sign(&Claims::bus("ingest", 1000, 3600));
        assert_eq!(
            c(Some("ingest"), Some(&svc), None, 1500),
            (NotAuthorized, Refusal::WrongCourier)
        );
        for w in [
            will("couriers/c2/status"),
            will("couriers/c1/loc"),
            will("track/o1"),
            Will {
                retain: true,
                ..will("couriers/c1/status")
            },
            Will {
                qos: 2,
                ..will("couriers/c1/status")
            },
        ] {
            assert_eq!(
                c(Some("c1"), Some(&t), Some(w.clone()), 1500),
                (NotAuthorized, Refusal::Will),
                "{w:?}"
            );
        }
    }

    #[test]
    fn publish_only_on_own_topics_without_retain_or_qos2() {
        assert_eq!(
            publish("c1", &publish_on("couriers/c1/loc")),
            Verdict::Forward
        );
        assert_eq!(
            publish("c1", &publish_on("couriers/c1/status")),
            Verdict::Forward
        );
        for t in [
            "couriers/c2/loc",
            "couriers/c2/status",
            "couriers/c1/other",
            "couriers/c1",
            "couriers/+/loc",
            "couriers/#",
            "track/o1",
            "$share/ingest/couriers/c1/loc",
            "$SYS/x",
            "",
        ] {
            assert_eq!(
                publish("c1", &publish_on(t)),
                Verdict::Refuse(Refusal::Topic),
                "{t}"
            );
        }
        let mut p = publish_on("couriers/c1/loc");
        p.retain = true;
        assert_eq!(publish("c1", &p), Verdict::Refuse(Refusal::Retain));
        p.retain = false;
        p.qos = 2;
        assert_eq!(publish("c1", &p), Verdict::Refuse(Refusal::Qos));
        p.qos = 1;
        assert_eq!(publish("c1", &p), Verdict::Forward);
        p.topic_alias = true;
        assert_eq!(publish("c1", &p), Verdict::Refuse(Refusal::Protocol));
    }

    #[test]
    fn bucket_allows_the_burst_then_the_rate() {
        let r = Rate {
            per_second: 20.0,
            burst: 100.0,
        };
        let mut b = Bucket::full(r, 0.0);
        assert_eq!((0..150).filter(|_| b.take(r, 0.0)).count(), 100);
        // One second later: 20 more.
        assert_eq!((0..50).filter(|_| b.take(r, 1.0)).count(), 20);
        // A clock that steps back gives nothing extra.
        assert!(!b.take(r, 0.5));
    }

    proptest! {
        /// Over any sequence of arrivals, what passes never exceeds burst + rate x elapsed.
        #[test]
        fn bucket_never_passes_more_than_burst_plus_rate(gaps in proptest::collection::vec(0.0f64..0.2, 1..2000)) {
            let r = Rate { per_second: 20.0, burst: 50.0 };
            let mut b = Bucket::full(r, 0.0);
            let (mut now, mut passed) = (0.0, 0u32);
            for g in gaps {
                now += g;
                if b.take(r, now) { passed += 1; }
            }
            prop_assert!(passed as f64 <= 50.0 + 20.0 * now + 1.0);
        }
    }
}
