//! MQTT topic names and their parsing.

/// What a courier topic carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CourierTopic<'a> {
    /// `couriers/{id}/loc`: one GPS point.
    Loc(&'a str),
    /// `couriers/{id}/status`: `online` or `offline` (the app's Last Will).
    Status(&'a str),
}

/// Longest courier or order id we accept. Ids become Redis members and topic levels; a bound
/// keeps a hostile id from bloating either.
pub(crate) const MAX_ID_LEN: usize = 64;

/// Ids are short tokens: letters, digits, `-`, `_`, `.`, `:`. This keeps MQTT wildcards,
/// separators and control characters out of topics and keys.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// Parses `couriers/{id}/loc` or `couriers/{id}/status`; `None` for anything else, including an
/// id that is not a [`valid_id`].
pub fn parse_courier_topic(topic: &str) -> Option<CourierTopic<'_>> {
    let rest = topic.strip_prefix("couriers/")?;
    let (id, leaf) = rest.split_once('/')?;
    if !valid_id(id) {
        return None;
    }
    match leaf {
        "loc" => Some(CourierTopic::Loc(id)),
        "status" => Some(CourierTopic::Status(id)),
        _ => None,
    }
}

/// `couriers/{id}/loc`
pub fn loc_topic(courier: &str) -> String {
    format!("couriers/{courier}/loc")
}

/// `couriers/{id}/status`
pub fn status_topic(courier: &str) -> String {
    format!("couriers/{courier}/status")
}

/// `track/{order}`
pub fn track_topic(order: &str) -> String {
    format!("track/{order}")
}

/// A role's filter over every courier's points: `$share/<group>/couriers/+/loc`, or with no
/// group (`""`) a plain subscription that takes every point itself.
pub fn loc_filter(group: &str) -> String {
    group_filter(group, "couriers/+/loc")
}

/// A role's filter over every courier's status. A shared one must be a group of its own: two
/// filters under one group name lose half the messages on rumqttd.
pub fn status_filter(group: &str) -> String {
    group_filter(group, "couriers/+/status")
}

/// Why a plain subscription at all: rumqttd's round-robin groups read ONE message per router
/// pass and member (and wake the member's connection for it), where a plain subscription gets up
/// to `max_outgoing_packet_count` per pass. A node with one consumer per stream needs no group.
fn group_filter(group: &str, filter: &str) -> String {
    if group.is_empty() {
        filter.to_string()
    } else {
        format!("$share/{group}/{filter}")
    }
}

/// A subscription group name, or `""` (no group). The name cannot hold `/`, `+`, `#` or `:`.
pub fn valid_group(group: &str) -> bool {
    group.is_empty() || (valid_id(group) && !group.contains(':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_loc_and_status() {
        assert_eq!(
            parse_courier_topic("couriers/c00042/loc"),
            Some(CourierTopic::Loc("c00042"))
        );
        assert_eq!(
            parse_courier_topic("couriers/c-1/status"),
            Some(CourierTopic::Status("c-1"))
        );
    }

    #[test]
    fn rejects_other_topics() {
        for t in [
            "couriers//loc",
            "couriers/a/b/loc",
            "couriers/a/location",
            "couriers/a",
            "track/o1",
            "couriers/a+b/loc",
            "couriers/a#/loc",
            "couriers/\u{0}/loc",
        ] {
            assert_eq!(parse_courier_topic(t), None, "{t:?}");
        }
        let long = format!("couriers/{}/loc", "x".repeat(MAX_ID_LEN + 1));
        assert_eq!(parse_courier_topic(&long), None);
    }

    #[test]
    fn builds_topics() {
        assert_eq!(loc_topic("c1"), "couriers/c1/loc");
        assert_eq!(status_topic("c1"), "couriers/c1/status");
        assert_eq!(track_topic("o9"), "track/o9");
        assert_eq!(loc_filter("ingest"), "$share/ingest/couriers/+/loc");
        assert_eq!(
            status_filter("ingest-status"),
            "$share/ingest-status/couriers/+/status"
        );
        assert_eq!(loc_filter(""), "couriers/+/loc");
        assert_eq!(status_filter(""), "couriers/+/status");
    }

    #[test]
    fn group_names() {
        for ok in ["", "ingest", "history-2", "a_b"] {
            assert!(valid_group(ok), "{ok:?}");
        }
        for bad in ["a/b", "a+", "#", "a:b", "a b"] {
            assert!(!valid_group(bad), "{bad:?}");
        }
    }
}
