//! Notices to a customer's closed app through a push provider: the message and the rule from
//! the provider's answer to an outcome. Provider-agnostic: one HTTP POST per notice to
//! `notify.push_url` (an adapter in front of FCM, APNs or a vendor), with
//! `Authorization: Bearer <notify.push_key>` when set:
//!
//! ```json
//! {"to": "<device token>", "notice_id": "ntc_17", "collapse_key": "o-1:order.delivered",
//!  "title": "Delivered", "body": "Your order has been delivered.",
//!  "data": {"order_id": "o-1", "kind": "order.delivered"}}
//! ```
//!
//! | provider answer                    | outcome                                              |
//! |------------------------------------|------------------------------------------------------|
//! | 2xx                                | sent                                                 |
//! | 404, 410                           | the token is dead: device retired, its notices stop  |
//! | 429, 5xx, no answer                | retried as webhooks are (`retry`, `Retry-After`)      |
//! | other 4xx                          | dead (the request itself is wrong)                   |
//!
//! Once per (device, kind) is the outbox's unique index, not this code: `notice_id` and
//! `collapse_key` let the provider drop a repeat sent after a lost answer.

use crate::deliver::Answer;
use crate::outbox::{ClaimedNotice, NoticeOutcome};
use crate::retry::{Next, Policy};
use serde::Serialize;
use std::time::Duration;

#[derive(Serialize)]
struct Body<'a> {
    to: &'a str,
    notice_id: String,
    collapse_key: String,
    title: &'a str,
    body: &'a str,
    data: Data<'a>,
}

#[derive(Serialize)]
struct Data<'a> {
    order_id: &'a str,
    kind: &'a str,
}

/// What the customer reads, per kind (no place, no courier name).
pub(crate) fn text(kind: &str) -> (&'static str, &'static str) {
    match kind {
        "order.assigned" => ("Courier assigned", "A courier is on your order."),
        "order.picked_up" => ("On its way", "The courier has picked up your order."),
        "courier.arriving_dropoff" => (
            "Your courier is arriving",
            "Your courier is almost at your door.",
        ),
        "order.delivered" => ("Delivered", "Your order has been delivered."),
        _ => ("Order update", "There is news about your order."),
    }
}

/// The provider request of one notice.
pub(crate) fn message(n: &ClaimedNotice) -> Vec<u8> {
    let (title, body) = text(&n.kind);
    serde_json::to_vec(&Body {
        to: &n.token,
        notice_id: format!("ntc_{}", n.notice_id),
        collapse_key: format!("{}:{}", n.order_id, n.kind),
        title,
        body,
        data: Data {
            order_id: &n.order_id,
            kind: &n.kind,
        },
    })
    .expect("the body serializes")
}

/// The outcome of a push attempt (`unit`: random in [0, 1) for the jitter).
pub(crate) fn decide(
    answer: &Answer,
    n: &ClaimedNotice,
    policy: &Policy,
    now: f64,
    unit: f64,
) -> NoticeOutcome {
    let (status, retry_after, error) = match answer {
        Answer::Status { code, .. } if (200..300).contains(code) => {
            return NoticeOutcome::Sent { status: *code }
        }
        Answer::Status {
            code: code @ (404 | 410),
            ..
        } => return NoticeOutcome::Unregistered { status: *code },
        Answer::Status { code, retry_after } if *code == 429 || *code >= 500 => {
            let ra = retry_after.filter(|_| matches!(code, 429 | 503));
            (Some(*code), ra, format!("HTTP {code}"))
        }
        Answer::Status { code, .. } => {
            return NoticeOutcome::Dead {
                status: Some(*code),
                error: format!("HTTP {code}"),
            }
        }
        Answer::Failed(e) => (None, None, e.clone()),
    };
    let age = Duration::from_secs_f64((now - n.first_attempt_at).max(0.0));
    match policy.after_failure(n.attempts, age, retry_after, unit) {
        Next::Retry(after) => NoticeOutcome::Retry {
            after,
            status,
            error,
        },
        Next::Dead => NoticeOutcome::Dead { status, error },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice() -> ClaimedNotice {
        ClaimedNotice {
            notice_id: 17,
            attempts: 1,
            first_attempt_at: 100.0,
            device_id: 3,
            token: "tok".into(),
            retired: false,
            order_id: "o-1".into(),
            kind: "order.delivered".into(),
        }
    }

    #[test]
    fn the_message_names_the_notice_for_the_providers_dedupe() {
        let v: serde_json::Value = serde_json::from_slice(&message(&notice())).unwrap();
        assert_eq!(v["notice_id"], "ntc_17");
        assert_eq!(v["collapse_key"], "o-1:order.delivered");
        assert_eq!(v["to"], "tok");
        assert_eq!(v["title"], "Delivered");
    }

    #[test]
    fn provider_answers() {
        let p = crate::NotifyConfig::default().policy();
        let d = |code| {
            decide(
                &Answer::Status {
                    code,
                    retry_after: None,
                },
                &notice(),
                &p,
                100.0,
                0.0,
            )
        };
        assert_eq!(d(200), NoticeOutcome::Sent { status: 200 });
        assert_eq!(d(410), NoticeOutcome::Unregistered { status: 410 });
        assert_eq!(d(404), NoticeOutcome::Unregistered { status: 404 });
        assert!(matches!(d(400), NoticeOutcome::Dead { .. }));
        assert!(matches!(d(502), NoticeOutcome::Retry { .. }));
        assert!(matches!(d(429), NoticeOutcome::Retry { .. }));
        let no = decide(&Answer::Failed("x".into()), &notice(), &p, 100.0, 0.0);
        assert!(matches!(no, NoticeOutcome::Retry { status: None, .. }));
    }
}
