//! The MQTT side of a viewer connection, on rumqttc's maintained packet codecs
//! (`rumqttc::mqttbytes::v4` for MQTT 3.1.1, `rumqttc::v5::mqttbytes::v5` for MQTT 5): both
//! read and write every packet a server needs. Written here by hand, and only because no crate
//! function does it: telling 3.1.1 from 5 before decoding the CONNECT (a peek at the protocol
//! level byte), and the MQTT 5 DISCONNECT without a reason code (remaining length 0, which the
//! v5 `Packet::read` refuses although the spec allows it).

use bytes::{Bytes, BytesMut};
use rumqttc::mqttbytes::{self as b4, v4};
use rumqttc::v5::mqttbytes::{self as b5, v5};

/// The protocol a viewer speaks, fixed by its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// MQTT 3.1.1 (protocol level 4).
    V4,
    /// MQTT 5.
    V5,
}

/// What a viewer sent, reduced to what the gateway acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    Connect {
        version: Version,
        keep_alive: u16,
        password: Option<String>,
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
    Disconnect,
    /// A viewer never publishes: it is disconnected.
    Publish,
    /// A second CONNECT, an acknowledgement of something never sent, AUTH: a protocol error.
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

/// The protocol level of a CONNECT at the start of `buf`: `Ok(None)` while incomplete.
pub fn connect_level(buf: &[u8]) -> Result<Option<u8>, DecodeError> {
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
                return Ok(Some(Inbound::Disconnect));
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

fn password(p: String) -> Option<String> {
    (!p.is_empty()).then_some(p)
}

fn from_v4(p: v4::Packet) -> Inbound {
    match p {
        v4::Packet::Connect(c) if c.protocol == b4::Protocol::V4 => Inbound::Connect {
            version: Version::V4,
            keep_alive: c.keep_alive,
            password: c.login.and_then(|l| password(l.password)),
        },
        v4::Packet::Subscribe(s) => Inbound::Subscribe {
            pkid: s.pkid,
            filters: s.filters.into_iter().map(|f| f.path).collect(),
        },
        v4::Packet::Unsubscribe(u) => Inbound::Unsubscribe {
            pkid: u.pkid,
            filters: u.topics,
        },
        v4::Packet::PingReq => Inbound::PingReq,
        v4::Packet::Disconnect => Inbound::Disconnect,
        v4::Packet::Publish(_) => Inbound::Publish,
        _ => Inbound::Unexpected,
    }
}

fn from_v5(p: v5::Packet) -> Inbound {
    match p {
        v5::Packet::Connect(c, _will, login) => Inbound::Connect {
            version: Version::V5,
            keep_alive: c.keep_alive,
            password: login.and_then(|l| password(l.password)),
        },
        v5::Packet::Subscribe(s) => Inbound::Subscribe {
            pkid: s.pkid,
            filters: s.filters.into_iter().map(|f| f.path).collect(),
        },
        v5::Packet::Unsubscribe(u) => Inbound::Unsubscribe {
            pkid: u.pkid,
            filters: u.filters,
        },
        v5::Packet::PingReq(_) => Inbound::PingReq,
        v5::Packet::Disconnect(_) => Inbound::Disconnect,
        v5::Packet::Publish(_) => Inbound::Publish,
        _ => Inbound::Unexpected,
    }
}

/// Why the gateway closes a connection; MQTT 5 viewers are told in a DISCONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The order ended or the viewer did something its token does not allow (PUBLISH).
    NotAuthorized,
    /// The token expired: "the maximum connection time authorized has been exceeded".
    TokenExpired,
    ProtocolError,
    KeepAliveTimeout,
    ServerShuttingDown,
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

/// CONNACK: accepted, or refused as not authorized (3.1.1 code 5, MQTT 5 reason 0x87), or as
/// server unavailable (too many viewers).
pub fn connack(version: Version, outcome: ConnectOutcome) -> Bytes {
    match version {
        Version::V4 => write4(v4::Packet::ConnAck(v4::ConnAck::new(
            match outcome {
                ConnectOutcome::Accepted => v4::ConnectReturnCode::Success,
                ConnectOutcome::NotAuthorized => v4::ConnectReturnCode::NotAuthorized,
                ConnectOutcome::Busy => v4::ConnectReturnCode::ServiceUnavailable,
            },
            false,
        ))),
        Version::V5 => write5(v5::Packet::ConnAck(v5::ConnAck {
            session_present: false,
            code: match outcome {
                ConnectOutcome::Accepted => v5::ConnectReturnCode::Success,
                ConnectOutcome::NotAuthorized => v5::ConnectReturnCode::NotAuthorized,
                ConnectOutcome::Busy => v5::ConnectReturnCode::ServerBusy,
            },
            properties: None,
        })),
    }
}

/// How a CONNECT is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectOutcome {
    Accepted,
    NotAuthorized,
    Busy,
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

pub fn pingresp(version: Version) -> Bytes {
    match version {
        Version::V4 => write4(v4::Packet::PingResp),
        Version::V5 => write5(v5::Packet::PingResp(v5::PingResp)),
    }
}

/// The DISCONNECT an MQTT 5 viewer gets before the gateway closes; 3.1.1 has none (the
/// server just closes).
pub fn disconnect(version: Version, reason: CloseReason) -> Option<Bytes> {
    let (code, why) = match reason {
        CloseReason::NotAuthorized => (
            v5::DisconnectReasonCode::NotAuthorized,
            "not authorized: the order ended or the request is not allowed",
        ),
        CloseReason::TokenExpired => (
            v5::DisconnectReasonCode::MaximumConnectTime,
            "tracking token expired",
        ),
        CloseReason::ProtocolError => (v5::DisconnectReasonCode::ProtocolError, "protocol error"),
        CloseReason::KeepAliveTimeout => (
            v5::DisconnectReasonCode::KeepAliveTimeout,
            "keep-alive timeout",
        ),
        CloseReason::ServerShuttingDown => (
            v5::DisconnectReasonCode::ServerShuttingDown,
            "server shutting down",
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
                password: Some("tok".into())
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
                password: Some("tok5".into())
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
        assert_eq!(decode(v, &mut b, 4096).unwrap(), Some(Inbound::Publish));
        assert_eq!(decode(v, &mut b, 4096).unwrap(), Some(Inbound::PingReq));
        assert_eq!(decode(v, &mut b, 4096).unwrap(), Some(Inbound::Disconnect));
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
        assert_eq!(decode(v, &mut b, 4096).unwrap(), Some(Inbound::Disconnect));
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
