//! MQTT packets of the edge's connections (couriers' phones, customers' viewers), on rumqttc's
//! maintained packet codecs (`rumqttc::mqttbytes::v4` for MQTT 3.1.1, `rumqttc::v5::mqttbytes::v5`
//! for MQTT 5): both read and write every packet a server needs. Written here by hand, and only
//! because no crate function does it: telling 3.1.1 from 5 before decoding the CONNECT (a peek at
//! the protocol level byte), the MQTT 5 DISCONNECT without a reason code (remaining length 0,
//! which the v5 `Packet::read` refuses although the spec allows it), and the size check of a
//! packet from its fixed header before its body has arrived ([`announced_len`]).

use bytes::{Bytes, BytesMut};
use rumqttc::mqttbytes::{self as b4, v4};
use rumqttc::v5::mqttbytes::{self as b5, v5};

/// The protocol a client speaks, fixed by its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// MQTT 3.1.1 (protocol level 4).
    V4,
    /// MQTT 5.
    V5,
}

/// A Last Will as the client asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will {
    pub topic: String,
    pub payload: Bytes,
    pub qos: u8,
    pub retain: bool,
}

/// A PUBLISH as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    pub topic: String,
    pub payload: Bytes,
    pub qos: u8,
    pub retain: bool,
    pub pkid: u16,
    /// MQTT 5 topic alias (never granted: the CONNACK offers none).
    pub topic_alias: bool,
}

/// What a client sent, reduced to what the edge acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    Connect {
        version: Version,
        keep_alive: u16,
        client_id: String,
        username: Option<String>,
        password: Option<String>,
        will: Option<Will>,
    },
    Subscribe {
        pkid: u16,
        filters: Vec<String>,
    },
    Unsubscribe {
        pkid: u16,
        filters: Vec<String>,
    },
    PingReq,
    /// DISCONNECT; `with_will` for MQTT 5 reason 0x04 (publish the Will anyway).
    Disconnect {
        with_will: bool,
    },
    Publish(Publish),
    /// An acknowledgement of something never sent, AUTH, a second CONNECT: a protocol error.
    Unexpected,
}

/// A packet that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("first packet is not CONNECT")]
    NotConnect,
    #[error("unsupported protocol level {0}")]
    Level(u8),
    #[error("malformed packet: {0}")]
    Malformed(String),
    #[error("packet larger than {0} bytes")]
    TooLarge(usize),
}

/// The whole size (fixed header included) of the packet at the start of `buf`, read from its
/// fixed header: `Ok(None)` while the header is incomplete. Lets a reader refuse an oversize
/// packet before buffering its body.
pub(crate) fn announced_len(buf: &[u8]) -> Result<Option<usize>, DecodeError> {
    let mut len = 0usize;
    for i in 0..4 {
        let Some(&b) = buf.get(1 + i) else {
            return Ok(None);
        };
        len |= ((b & 0x7F) as usize) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some(1 + (i + 1) + len));
        }
    }
    Err(DecodeError::Malformed("remaining length".into()))
}

/// The protocol level of a CONNECT at the start of `buf`: `Ok(None)` while incomplete.
pub(crate) fn connect_level(buf: &[u8]) -> Result<Option<u8>, DecodeError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    if first >> 4 != 1 {
        return Err(DecodeError::NotConnect);
    }
    // Remaining length: 1-4 bytes of 7 bits.
    let mut i = 1;
    loop {
        let Some(&b) = buf.get(i) else {
            return Ok(None);
        };
        i += 1;
        if b & 0x80 == 0 {
            break;
        }
        if i > 4 {
            return Err(DecodeError::Malformed("remaining length".into()));
        }
    }
    // Protocol name (2-byte length + "MQTT"), then the level.
    let (Some(&hi), Some(&lo)) = (buf.get(i), buf.get(i + 1)) else {
        return Ok(None);
    };
    let name_len = u16::from_be_bytes([hi, lo]) as usize;
    Ok(buf.get(i + 2 + name_len).copied())
}

/// Reads the next whole packet out of `buf`: `Ok(None)` while it is incomplete. `version` is
/// `None` until CONNECT has been read.
pub fn decode(
    version: Option<Version>,
    buf: &mut BytesMut,
    max: usize,
) -> Result<Option<Inbound>, DecodeError> {
    if buf.is_empty() {
        return Ok(None);
    }
    if announced_len(buf)?.is_some_and(|n| n > max) {
        return Err(DecodeError::TooLarge(max));
    }
    let version = match version {
        Some(v) => v,
        None => match connect_level(buf)? {
            None => return Ok(None),
            Some(4) => Version::V4,
            Some(5) => Version::V5,
            Some(l) => return Err(DecodeError::Level(l)),
        },
    };
    match version {
        Version::V4 => match v4::Packet::read(buf, max) {
            Ok(p) => Ok(Some(from_v4(p))),
            Err(b4::Error::InsufficientBytes(_)) => Ok(None),
            Err(b4::Error::PayloadSizeLimitExceeded { .. }) => Err(DecodeError::TooLarge(max)),
            Err(e) => Err(DecodeError::Malformed(e.to_string())),
        },
        Version::V5 => {
            if buf.len() >= 2 && buf[0] == 0xE0 && buf[1] == 0 {
                let _ = buf.split_to(2);
                return Ok(Some(Inbound::Disconnect { with_will: false }));
            }
            match v5::Packet::read(buf, Some(max as u32)) {
                Ok(p) => Ok(Some(from_v5(p))),
                Err(b5::Error::InsufficientBytes(_)) => Ok(None),
                Err(b5::Error::PayloadSizeLimitExceeded { .. }) => Err(DecodeError::TooLarge(max)),
                Err(e) => Err(DecodeError::Malformed(e.to_string())),
            }
        }
    }
}

fn nonempty(p: String) -> Option<String> {
    (!p.is_empty()).then_some(p)
}

fn qos4(q: b4::QoS) -> u8 {
    q as u8
}

fn qos5(q: b5::QoS) -> u8 {
    q as u8
}

fn from_v4(p: v4::Packet) -> Inbound {
    match p {
        v4::Packet::Connect(c) if c.protocol == b4::Protocol::V4 => {
            let (username, password) = match c.login {
                Some(l) => (nonempty(l.username), nonempty(l.password)),
                None => (None, None),
            };
            Inbound::Connect {
                version: Version::V4,
                keep_alive: c.keep_alive,
                client_id: c.client_id,
                username,
                password,
                will: c.last_will.map(|w| Will {
                    topic: w.topic,
                    payload: w.message,
                    qos: qos4(w.qos),
                    retain: w.retain,
                }),
            }
        }
        v4::Packet::Subscribe(s) => Inbound::Subscribe {
            pkid: s.pkid,
            filters: s.filters.into_iter().map(|f| f.path).collect(),
        },
        v4::Packet::Unsubscribe(u) => Inbound::Unsubscribe {
            pkid: u.pkid,
            filters: u.topics,
        },
        v4::Packet::PingReq => Inbound::PingReq,
        v4::Packet::Disconnect => Inbound::Disconnect { with_will: false },
        v4::Packet::Publish(p) => Inbound::Publish(Publish {
            topic: p.topic,
            payload: p.payload,
            qos: qos4(p.qos),
            retain: p.retain,
            pkid: p.pkid,
            topic_alias: false,
        }),
        _ => Inbound::Unexpected,
    }
}

fn from_v5(p: v5::Packet) -> Inbound {
    match p {
        v5::Packet::Connect(c, will, login) => {
            let (username, password) = match login {
                Some(l) => (nonempty(l.username), nonempty(l.password)),
                None => (None, None),
            };
            Inbound::Connect {
                version: Version::V5,
                keep_alive: c.keep_alive,
                client_id: c.client_id,
                username,
                password,
                will: will.map(|w| Will {
                    topic: String::from_utf8_lossy(&w.topic).into_owned(),
                    payload: w.message,
                    qos: qos5(w.qos),
                    retain: w.retain,
                }),
            }
        }
        v5::Packet::Subscribe(s) => Inbound::Subscribe {
            pkid: s.pkid,
            filters: s.filters.into_iter().map(|f| f.path).collect(),
        },
        v5::Packet::Unsubscribe(u) => Inbound::Unsubscribe {
            pkid: u.pkid,
            filters: u.filters,
        },
        v5::Packet::PingReq(_) => Inbound::PingReq,
        v5::Packet::Disconnect(d) => Inbound::Disconnect {
            with_will: d.reason_code == v5::DisconnectReasonCode::DisconnectWithWillMessage,
        },
        v5::Packet::Publish(p) => Inbound::Publish(Publish {
            topic: String::from_utf8_lossy(&p.topic).into_owned(),
            payload: p.payload,
            qos: qos5(p.qos),
            retain: p.retain,
            pkid: p.pkid,
            topic_alias: p
                .properties
                .as_ref()
                .is_some_and(|pr| pr.topic_alias.is_some()),
        }),
        _ => Inbound::Unexpected,
    }
}

/// Why the edge closes a connection; MQTT 5 clients are told in a DISCONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The order ended, or the client did something its token does not allow.
    NotAuthorized,
    /// The token expired: "the maximum connection time authorized has been exceeded".
    TokenExpired,
    ProtocolError,
    KeepAliveTimeout,
    ServerShuttingDown,
    /// A retained PUBLISH (the CONNACK said retain is not available).
    RetainNotSupported,
    /// A QoS 2 PUBLISH (the CONNACK said the maximum QoS is 1).
    QosNotSupported,
    /// A packet over the size limit.
    PacketTooLarge,
    /// Another connection logged in as the same courier.
    SessionTakenOver,
}

fn write4(p: v4::Packet) -> Bytes {
    let mut out = BytesMut::with_capacity(p.size());
    p.write(&mut out, usize::MAX)
        .expect("server packets are small");
    out.freeze()
}

fn write5(p: v5::Packet) -> Bytes {
    let mut out = BytesMut::with_capacity(p.size());
    p.write(&mut out, None).expect("server packets are small");
    out.freeze()
}

/// How a CONNECT is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectOutcome {
    Accepted,
    /// A missing, malformed, forged or expired credential (3.1.1 code 4, MQTT 5 0x86).
    BadCredentials,
    /// A valid credential that does not allow this (3.1.1 code 5, MQTT 5 0x87).
    NotAuthorized,
    /// The server is full or cannot check now (3.1.1 code 3, MQTT 5 0x89).
    Busy,
}

/// What the CONNACK of an accepted MQTT 5 client announces.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Largest packet the server accepts.
    pub max_packet: Option<u32>,
    /// Highest QoS of a PUBLISH the server takes (1 for couriers).
    pub max_qos: Option<u8>,
    /// Retained messages are refused.
    pub no_retain: bool,
}

/// CONNACK (see [`ConnectOutcome`]); `limits` go into MQTT 5 properties of an accepted one.
pub fn connack(version: Version, outcome: ConnectOutcome) -> Bytes {
    connack_with(version, outcome, Limits::default())
}

/// CONNACK announcing `limits` to an MQTT 5 client.
pub(crate) fn connack_with(version: Version, outcome: ConnectOutcome, limits: Limits) -> Bytes {
    match version {
        Version::V4 => write4(v4::Packet::ConnAck(v4::ConnAck::new(
            match outcome {
                ConnectOutcome::Accepted => v4::ConnectReturnCode::Success,
                ConnectOutcome::BadCredentials => v4::ConnectReturnCode::BadUserNamePassword,
                ConnectOutcome::NotAuthorized => v4::ConnectReturnCode::NotAuthorized,
                ConnectOutcome::Busy => v4::ConnectReturnCode::ServiceUnavailable,
            },
            false,
        ))),
        Version::V5 => {
            let properties = (outcome == ConnectOutcome::Accepted && limits != Limits::default())
                .then(|| v5::ConnAckProperties {
                    max_packet_size: limits.max_packet,
                    max_qos: limits.max_qos,
                    retain_available: limits.no_retain.then_some(0),
                    wildcard_subscription_available: limits.no_retain.then_some(0),
                    shared_subscription_available: limits.no_retain.then_some(0),
                    session_expiry_interval: None,
                    receive_max: None,
                    assigned_client_identifier: None,
                    topic_alias_max: None,
                    reason_string: None,
                    user_properties: Vec::new(),
                    subscription_identifiers_available: None,
                    server_keep_alive: None,
                    response_information: None,
                    server_reference: None,
                    authentication_method: None,
                    authentication_data: None,
                });
            write5(v5::Packet::ConnAck(v5::ConnAck {
                session_present: false,
                code: match outcome {
                    ConnectOutcome::Accepted => v5::ConnectReturnCode::Success,
                    ConnectOutcome::BadCredentials => v5::ConnectReturnCode::BadUserNamePassword,
                    ConnectOutcome::NotAuthorized => v5::ConnectReturnCode::NotAuthorized,
                    ConnectOutcome::Busy => v5::ConnectReturnCode::ServerBusy,
                },
                properties,
            }))
        }
    }
}

/// SUBACK: one code per filter, granted at QoS 0 or refused (3.1.1 0x80, MQTT 5 0x87).
pub fn suback(version: Version, pkid: u16, granted: &[bool]) -> Bytes {
    match version {
        Version::V4 => write4(v4::Packet::SubAck(v4::SubAck::new(
            pkid,
            granted
                .iter()
                .map(|&g| {
                    if g {
                        v4::SubscribeReasonCode::Success(b4::QoS::AtMostOnce)
                    } else {
                        v4::SubscribeReasonCode::Failure
                    }
                })
                .collect(),
        ))),
        Version::V5 => write5(v5::Packet::SubAck(v5::SubAck {
            pkid,
            return_codes: granted
                .iter()
                .map(|&g| {
                    if g {
                        v5::SubscribeReasonCode::Success(b5::QoS::AtMostOnce)
                    } else {
                        v5::SubscribeReasonCode::NotAuthorized
                    }
                })
                .collect(),
            properties: None,
        })),
    }
}

/// UNSUBACK for `n` filters.
pub fn unsuback(version: Version, pkid: u16, n: usize) -> Bytes {
    match version {
        Version::V4 => write4(v4::Packet::UnsubAck(v4::UnsubAck::new(pkid))),
        Version::V5 => write5(v5::Packet::UnsubAck(v5::UnsubAck {
            pkid,
            reasons: vec![v5::UnsubAckReason::Success; n.max(1)],
            properties: None,
        })),
    }
}

/// How a QoS 1 PUBLISH is acknowledged. MQTT 3.1.1 has no refusal code: its PUBACK says only
/// "received", and the edge closes the connection instead where MQTT 5 would refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ack {
    Taken,
    NotAuthorized,
    /// Over the courier's rate: dropped.
    QuotaExceeded,
}

/// PUBACK of a QoS 1 PUBLISH.
pub(crate) fn puback(version: Version, pkid: u16, ack: Ack) -> Bytes {
    match version {
        Version::V4 => write4(v4::Packet::PubAck(v4::PubAck::new(pkid))),
        Version::V5 => write5(v5::Packet::PubAck(v5::PubAck {
            pkid,
            reason: match ack {
                Ack::Taken => v5::PubAckReason::Success,
                Ack::NotAuthorized => v5::PubAckReason::NotAuthorized,
                Ack::QuotaExceeded => v5::PubAckReason::QuotaExceeded,
            },
            properties: None,
        })),
    }
}

pub fn pingresp(version: Version) -> Bytes {
    match version {
        Version::V4 => write4(v4::Packet::PingResp),
        Version::V5 => write5(v5::Packet::PingResp(v5::PingResp)),
    }
}

/// The DISCONNECT an MQTT 5 client gets before the edge closes; 3.1.1 has none (the server
/// just closes).
pub fn disconnect(version: Version, reason: CloseReason) -> Option<Bytes> {
    use v5::DisconnectReasonCode as D;
    let (code, why) = match reason {
        CloseReason::NotAuthorized => (
            D::NotAuthorized,
            "not authorized: the order ended or the request is not allowed",
        ),
        CloseReason::TokenExpired => (D::MaximumConnectTime, "token expired"),
        CloseReason::ProtocolError => (D::ProtocolError, "protocol error"),
        CloseReason::KeepAliveTimeout => (D::KeepAliveTimeout, "keep-alive timeout"),
        CloseReason::ServerShuttingDown => (D::ServerShuttingDown, "server shutting down"),
        CloseReason::RetainNotSupported => (D::RetainNotSupported, "retain is not available"),
        CloseReason::QosNotSupported => (D::QoSNotSupported, "QoS 2 is not available"),
        CloseReason::PacketTooLarge => (D::PacketTooLarge, "packet too large"),
        CloseReason::SessionTakenOver => (
            D::SessionTakenOver,
            "another connection logged in with this id",
        ),
    };
    // With properties present the packet carries a property length, which rumqttc's own v5
    // reader requires after a reason code.
    let properties = v5::DisconnectProperties {
        session_expiry_interval: None,
        reason_string: Some(why.to_string()),
        user_properties: Vec::new(),
        server_reference: None,
    };
    match version {
        Version::V4 => None,
        Version::V5 => Some(write5(v5::Packet::Disconnect(v5::Disconnect {
            reason_code: code,
            properties: Some(properties),
        }))),
    }
}

/// A QoS 0 PUBLISH of a track payload.
pub fn publish(version: Version, topic: &str, payload: Bytes) -> Bytes {
    match version {
        Version::V4 => write4(v4::Packet::Publish(v4::Publish::from_bytes(
            topic,
            b4::QoS::AtMostOnce,
            payload,
        ))),
        Version::V5 => write5(v5::Packet::Publish(v5::Publish::new(
            topic,
            b5::QoS::AtMostOnce,
            payload,
            None,
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect4(password: Option<&str>) -> BytesMut {
        let mut c = v4::Connect::new("viewer-1");
        if let Some(p) = password {
            c.set_login("customer", p);
        }
        let mut b = BytesMut::new();
        v4::Packet::Connect(c).write(&mut b, 1 << 16).unwrap();
        b
    }

    fn connect5(password: Option<&str>) -> BytesMut {
        let c = v5::Connect {
            keep_alive: 30,
            client_id: "viewer-5".into(),
            clean_start: true,
            properties: None,
        };
        let login = password.map(|p| v5::Login::new("customer", p));
        let mut b = BytesMut::new();
        v5::Packet::Connect(c, None, login)
            .write(&mut b, None)
            .unwrap();
        b
    }

    #[test]
    fn reads_connect_of_both_versions_with_the_token() {
        let mut b = connect4(Some("tok"));
        assert_eq!(connect_level(&b).unwrap(), Some(4));
        let p = decode(None, &mut b, 4096).unwrap().unwrap();
        assert_eq!(
            p,
            Inbound::Connect {
                version: Version::V4,
                keep_alive: 10,
                client_id: "viewer-1".into(),
                username: Some("customer".into()),
                password: Some("tok".into()),
                will: None,
            }
        );
        assert!(b.is_empty());
        let mut b = connect5(Some("tok5"));
        let p = decode(None, &mut b, 4096).unwrap().unwrap();
        assert_eq!(
            p,
            Inbound::Connect {
                version: Version::V5,
                keep_alive: 30,
                client_id: "viewer-5".into(),
                username: Some("customer".into()),
                password: Some("tok5".into()),
                will: None,
            }
        );
        let mut b = connect5(None);
        assert!(matches!(
            decode(None, &mut b, 4096).unwrap(),
            Some(Inbound::Connect { password: None, .. })
        ));
    }

    #[test]
    fn partial_packets_wait_for_more_bytes() {
        let full = connect4(Some("tok"));
        for cut in 0..full.len() {
            let mut b = BytesMut::from(&full[..cut]);
            assert_eq!(decode(None, &mut b, 4096).unwrap(), None, "cut at {cut}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_connect_or_too_large() {
        let mut b = BytesMut::from(&[0xC0u8, 0x00][..]);
        assert_eq!(decode(None, &mut b, 4096), Err(DecodeError::NotConnect));
        let mut b = connect4(Some(&"x".repeat(5000)));
        assert_eq!(decode(None, &mut b, 4096), Err(DecodeError::TooLarge(4096)));
        // MQTT 3.1 ("MQIsdp", level 3).
        let mut b = BytesMut::from(
            &[
                0x10u8, 12, 0, 6, b'M', b'Q', b'I', b's', b'd', b'p', 3, 2, 0, 10,
            ][..],
        );
        assert_eq!(decode(None, &mut b, 4096), Err(DecodeError::Level(3)));
        for garbage in [
            &[0x10u8, 0xFF, 0xFF, 0xFF, 0xFF, 0x01][..],
            &[0x10, 3, 0, 9, b'M'],
        ] {
            let mut b = BytesMut::from(garbage);
            assert!(
                decode(None, &mut b, 4096).is_err()
                    || decode(None, &mut BytesMut::from(garbage), 4096) == Ok(None)
            );
        }
    }

    #[test]
    fn subscribe_publish_ping_and_disconnect_of_both_versions() {
        let mut b = BytesMut::new();
        v4::Packet::Subscribe(v4::Subscribe::new_many([
            v4::SubscribeFilter::new("track/o1".into(), b4::QoS::AtMostOnce),
            v4::SubscribeFilter::new("track/#".into(), b4::QoS::AtLeastOnce),
        ]))
        .write(&mut b, 4096)
        .unwrap();
        v4::Packet::Publish(v4::Publish::new("track/o1", b4::QoS::AtMostOnce, "x"))
            .write(&mut b, 4096)
            .unwrap();
        v4::Packet::PingReq.write(&mut b, 4096).unwrap();
        v4::Packet::Disconnect.write(&mut b, 4096).unwrap();
        let v = Some(Version::V4);
        assert!(
            matches!(decode(v, &mut b, 4096).unwrap(), Some(Inbound::Subscribe { filters, .. }) if filters == ["track/o1", "track/#"])
        );
        assert!(matches!(
            decode(v, &mut b, 4096).unwrap(),
            Some(Inbound::Publish(Publish { ref topic, qos: 0, retain: false, .. })) if topic == "track/o1"
        ));
        assert_eq!(decode(v, &mut b, 4096).unwrap(), Some(Inbound::PingReq));
        assert_eq!(
            decode(v, &mut b, 4096).unwrap(),
            Some(Inbound::Disconnect { with_will: false })
        );
        assert_eq!(decode(v, &mut b, 4096).unwrap(), None);

        let mut b = BytesMut::new();
        v5::Packet::Subscribe(v5::Subscribe::new(
            v5::Filter::new("$SYS/#", b5::QoS::AtMostOnce),
            None,
        ))
        .write(&mut b, None)
        .unwrap();
        v5::Packet::Unsubscribe(v5::Unsubscribe::new("track/o1", None))
            .write(&mut b, None)
            .unwrap();
        b.extend_from_slice(&[0xE0, 0x00]);
        let v = Some(Version::V5);
        assert!(
            matches!(decode(v, &mut b, 4096).unwrap(), Some(Inbound::Subscribe { filters, .. }) if filters == ["$SYS/#"])
        );
        assert!(
            matches!(decode(v, &mut b, 4096).unwrap(), Some(Inbound::Unsubscribe { filters, .. }) if filters == ["track/o1"])
        );
        assert_eq!(
            decode(v, &mut b, 4096).unwrap(),
            Some(Inbound::Disconnect { with_will: false })
        );
    }

    #[test]
    fn answers_decode_as_the_client_codec_reads_them() {
        let mut b = BytesMut::from(&connack(Version::V4, ConnectOutcome::NotAuthorized)[..]);
        assert!(
            matches!(v4::Packet::read(&mut b, 4096).unwrap(), v4::Packet::ConnAck(a) if a.code == v4::ConnectReturnCode::NotAuthorized)
        );
        let mut b = BytesMut::from(&connack(Version::V5, ConnectOutcome::NotAuthorized)[..]);
        assert!(
            matches!(v5::Packet::read(&mut b, None).unwrap(), v5::Packet::ConnAck(a) if a.code == v5::ConnectReturnCode::NotAuthorized)
        );
        let mut b = BytesMut::from(&suback(Version::V4, 7, &[true, false])[..]);
        let v4::Packet::SubAck(a) = v4::Packet::read(&mut b, 4096).unwrap() else {
            panic!()
        };
        assert_eq!(
            a.return_codes,
            [
                v4::SubscribeReasonCode::Success(b4::QoS::AtMostOnce),
                v4::SubscribeReasonCode::Failure
            ]
        );
        let mut b = BytesMut::from(&suback(Version::V5, 7, &[false])[..]);
        let v5::Packet::SubAck(a) = v5::Packet::read(&mut b, None).unwrap() else {
            panic!()
        };
        assert_eq!(a.return_codes, [v5::SubscribeReasonCode::NotAuthorized]);
        let mut b =
            BytesMut::from(&publish(Version::V5, "track/o1", Bytes::from_static(b"{}"))[..]);
        let v5::Packet::Publish(p) = v5::Packet::read(&mut b, None).unwrap() else {
            panic!()
        };
        assert_eq!(
            (&p.topic[..], &p.payload[..]),
            (&b"track/o1"[..], &b"{}"[..])
        );
        assert!(disconnect(Version::V4, CloseReason::NotAuthorized).is_none());
        let mut b =
            BytesMut::from(&disconnect(Version::V5, CloseReason::TokenExpired).unwrap()[..]);
        assert!(
            matches!(v5::Packet::read(&mut b, None).unwrap(), v5::Packet::Disconnect(d) if d.reason_code == v5::DisconnectReasonCode::MaximumConnectTime)
        );
    }
}
