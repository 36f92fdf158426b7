//! The dispatcher: claims due deliveries from the outbox, POSTs each as a signed Standard
//! Webhook, and stores what happened (delivered, retry at, dead) with the endpoint's breaker.
//!
//! `decide` is the pure rule from an answer to an outcome (with `retry` and `breaker`);
//! `run` is the loop: at most `concurrency` attempts in flight, each bounded by `timeout`.
//! Outcomes come back over a bounded channel to the one task that holds the PostgreSQL
//! connection. A process that dies mid-attempt stores nothing: the claim's lease runs out and
//! another dispatcher tries again (at least once; the `webhook-id` lets the consumer dedupe).
//! Per-endpoint ordering is not promised: retries and concurrent attempts reorder.

use crate::config::NotifyConfig;
use crate::events::Stats;
use crate::outbox::{self, Claimed, ClaimedNotice, NoticeOutcome, Outcome};
use crate::push;
use crate::retry::{parse_retry_after, Next, Policy};
use crate::sign;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::Rng as _;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

type Https = hyper_rustls::HttpsConnector<HttpConnector>;
/// The webhook HTTP client: pooled, HTTP/1.1, `http://` and `https://` (the system's roots).
pub(crate) type HttpClient = Client<Https, Full<Bytes>>;

/// Answers larger than this are not read to the end (the status is what counts).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// A client for webhook deliveries.
pub(crate) fn http_client() -> Result<HttpClient, std::io::Error> {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()?
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(https))
}

/// What one attempt got back.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    Status {
        code: u16,
        retry_after: Option<Duration>,
    },
    /// No answer: refused, reset, TLS, timeout. The text names the failure, not the payload.
    Failed(String),
}

/// The outcome of an attempt (`unit`: a random number in [0, 1) for the jitter).
pub(crate) fn decide(
    answer: &Answer,
    c: &Claimed,
    policy: &Policy,
    now: f64,
    unit: f64,
) -> Outcome {
    let (status, retry_after, error) = match answer {
        Answer::Status { code, .. } if (200..300).contains(code) => {
            return Outcome::Delivered { status: *code }
        }
        Answer::Status { code, retry_after } => {
            // Retry-After means "not before" only on the answers that define it so.
            let ra = retry_after.filter(|_| matches!(code, 429 | 503));
            (Some(*code), ra, format!("HTTP {code}"))
        }
        Answer::Failed(e) => (None, None, e.clone()),
    };
    let age = Duration::from_secs_f64((now - c.first_attempt_at).max(0.0));
    match policy.after_failure(c.attempts, age, retry_after, unit) {
        Next::Retry(after) => Outcome::Retry {
            after,
            status,
            error,
        },
        Next::Dead => Outcome::Dead { status, error },
    }
}

fn unix_now() -> f64 {
    courier_wire::clock::unix_now()
}

/// One POST of one delivery.
pub(crate) async fn attempt(http: &HttpClient, c: &Claimed, timeout: Duration) -> Answer {
    let msg = match sign::message(&c.secret, &c.event, unix_now() as i64) {
        Ok(m) => m,
        Err(_) => return Answer::Failed("the endpoint's secret is unusable".into()),
    };
    let headers = [
        ("webhook-id", msg.id),
        ("webhook-timestamp", msg.timestamp.to_string()),
        ("webhook-signature", msg.signature),
    ];
    post(http, &c.url, &headers, msg.body, timeout).await
}

/// POSTs a JSON body with `headers` and reads the answer's status and `Retry-After`, all
/// within `timeout`.
pub(crate) async fn post(
    http: &HttpClient,
    url: &str,
    headers: &[(&'static str, String)],
    body: Vec<u8>,
    timeout: Duration,
) -> Answer {
    let mut req = match Request::builder()
        .method(Method::POST)
        .uri(url)
        .body(Full::new(Bytes::from(body)))
    {
        Ok(r) => r,
        Err(_) => return Answer::Failed("the URL is unusable".into()),
    };
    let h = req.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(
        USER_AGENT,
        HeaderValue::from_static("courier-pipeline-notify/1"),
    );
    for (name, value) in headers {
        match HeaderValue::from_str(value) {
            Ok(v) => {
                h.insert(*name, v);
            }
            Err(_) => return Answer::Failed(format!("unusable {name} header")),
        }
    }
    let exchange = async {
        let resp = http.request(req).await.map_err(|e| {
            use std::error::Error as _;
            // The connector's cause ("connection refused", a TLS alert) is what helps.
            let cause = e
                .source()
                .map(|s| s.to_string())
                .unwrap_or_else(|| e.to_string());
            format!("no answer: {cause}")
        })?;
        let code = resp.status();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        // Read (bounded) so the connection goes back to the pool.
        let _ = Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await;
        Ok::<_, String>((code, retry_after))
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok((code, retry_after))) => Answer::Status {
            code: code.as_u16(),
            retry_after,
        },
        Ok(Err(e)) => Answer::Failed(e),
        Err(_) => Answer::Failed(format!("no answer within {timeout:?}")),
    }
}

/// The dispatcher of one process.
pub(crate) struct Dispatcher {
    pub database_url: String,
    pub config: NotifyConfig,
    pub stats: Arc<Stats>,
    pub http: HttpClient,
}

/// One claimed unit of work: a webhook delivery or a push notice.
enum Job {
    Webhook(Claimed),
    Notice(ClaimedNotice),
}

enum Done {
    Webhook(Claimed, Outcome),
    Notice(ClaimedNotice, NoticeOutcome),
}

impl Dispatcher {
    /// Delivers until `shutdown`, then lets the attempts in flight end (each within
    /// `timeout`), stores their outcomes and returns.
    pub async fn run(self, shutdown: CancellationToken) {
        let limit = self.config.concurrency;
        let (tx, mut rx) = mpsc::channel::<(Done, Duration)>(limit);
        let mut db: Option<tokio_postgres::Client> = None;
        let mut unsaved: Vec<(Done, Duration)> = Vec::new();
        let mut in_flight = 0usize;
        let push = self
            .config
            .push_url
            .clone()
            .map(|u| (u, self.config.push_key.clone()));
        loop {
            while let Ok(d) = rx.try_recv() {
                in_flight -= 1;
                unsaved.push(d);
            }
            let stopping = shutdown.is_cancelled();
            if stopping && in_flight == 0 && (unsaved.is_empty() || db.is_none()) {
                break;
            }
            let mut claimed = 0;
            match self
                .step(&mut db, &mut unsaved, limit - in_flight, stopping)
                .await
            {
                Ok(batch) => {
                    claimed = batch.len();
                    for job in batch {
                        in_flight += 1;
                        let (tx, http) = (tx.clone(), self.http.clone());
                        let (policy, timeout, push) =
                            (self.config.policy(), self.config.timeout, push.clone());
                        tokio::spawn(async move {
                            let started = Instant::now();
                            let done = run_job(&http, job, &policy, timeout, push).await;
                            // The channel has room for every attempt in flight.
                            let _ = tx.send((done, started.elapsed())).await;
                        });
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "notify dispatcher: postgres unavailable, retrying");
                    db = None;
                    if stopping && in_flight == 0 {
                        // Nothing stored is lost: unsaved attempts are tried again after the lease.
                        break;
                    }
                }
            }
            if claimed == 0 {
                let wait = if db.is_none() {
                    Duration::from_secs(1)
                } else {
                    self.config.poll_interval
                };
                tokio::select! {
                    d = rx.recv() => if let Some(d) = d { in_flight -= 1; unsaved.push(d); },
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.cancelled(), if !stopping => {}
                }
            }
        }
    }

    /// Stores finished attempts, then claims up to `room` more (none when stopping): webhook
    /// deliveries first, push notices with the room left.
    async fn step(
        &self,
        db: &mut Option<tokio_postgres::Client>,
        unsaved: &mut Vec<(Done, Duration)>,
        room: usize,
        stopping: bool,
    ) -> Result<Vec<Job>, crate::NotifyError> {
        let breaker = self.config.breaker();
        if db.is_none() {
            let mut c = history_writer::sink::connect(
                &self.database_url,
                "courier-pipeline notify dispatcher",
            )
            .await?;
            history_writer::migrate(&mut c).await?;
            *db = Some(c);
        }
        let client = db.as_mut().expect("connected above");
        // A round's successful webhooks in one statement; everything else one by one.
        let ok: Vec<(i64, i64, u16)> = unsaved
            .iter()
            .filter_map(|(d, _)| match d {
                Done::Webhook(c, Outcome::Delivered { status }) => {
                    Some((c.delivery_id, c.endpoint_id, *status))
                }
                _ => None,
            })
            .collect();
        outbox::delivered(client, &ok).await?;
        unsaved.retain(|(d, took)| {
            let delivered = matches!(d, Done::Webhook(_, Outcome::Delivered { .. }));
            if delivered {
                self.stats.attempt("delivered", *took);
            }
            !delivered
        });
        while let Some((done, took)) = unsaved.pop() {
            let stored = match &done {
                Done::Webhook(c, o) => outbox::complete(client, c, o, &breaker).await,
                Done::Notice(n, o) => outbox::complete_notice(client, n, o).await,
            };
            if let Err(e) = stored {
                unsaved.push((done, took));
                return Err(e.into());
            }
            match &done {
                Done::Webhook(_, o) => self.stats.attempt(
                    match o {
                        Outcome::Delivered { .. } => "delivered",
                        Outcome::Retry { .. } => "retry",
                        Outcome::Dead { .. } => "dead",
                    },
                    took,
                ),
                Done::Notice(_, o) => self.stats.notice(match o {
                    NoticeOutcome::Sent { .. } => "sent",
                    NoticeOutcome::Retry { .. } => "retry",
                    NoticeOutcome::Dead { .. } => "dead",
                    NoticeOutcome::Unregistered { .. } => "unregistered",
                    NoticeOutcome::Skipped => "skipped",
                }),
            }
        }
        if stopping || room == 0 {
            return Ok(Vec::new());
        }
        let mut jobs: Vec<Job> = outbox::claim(client, room, self.config.lease, &breaker)
            .await?
            .into_iter()
            .map(Job::Webhook)
            .collect();
        if self.config.push_url.is_some() && jobs.len() < room {
            let notices =
                outbox::claim_notices(client, room - jobs.len(), self.config.lease).await?;
            jobs.extend(notices.into_iter().map(Job::Notice));
        }
        Ok(jobs)
    }
}

async fn run_job(
    http: &HttpClient,
    job: Job,
    policy: &Policy,
    timeout: Duration,
    push: Option<(String, Option<String>)>,
) -> Done {
    let unit = || rand::rng().random::<f64>();
    match job {
        Job::Webhook(c) => {
            let answer = attempt(http, &c, timeout).await;
            let outcome = decide(&answer, &c, policy, unix_now(), unit());
            Done::Webhook(c, outcome)
        }
        Job::Notice(n) if n.retired => Done::Notice(n, NoticeOutcome::Skipped),
        Job::Notice(n) => {
            let Some((url, key)) = push else {
                return Done::Notice(n, NoticeOutcome::Skipped);
            };
            let headers: Vec<(&'static str, String)> = key
                .map(|k| ("authorization", format!("Bearer {k}")))
                .into_iter()
                .collect();
            let answer = post(http, &url, &headers, push::message(&n), timeout).await;
            let outcome = push::decide(&answer, &n, policy, unix_now(), unit());
            Done::Notice(n, outcome)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::Event;
    use hyper::StatusCode;

    fn claimed(attempts: u32, first: f64) -> Claimed {
        Claimed {
            delivery_id: 1,
            attempts,
            first_attempt_at: first,
            endpoint_id: 1,
            url: "http://127.0.0.1:1/".into(),
            secret: sign::new_secret(),
            failures: 0,
            event: Event {
                id: 1,
                kind: "order.assigned".into(),
                tenant: "t".into(),
                order_id: "o".into(),
                courier_id: None,
                occurred_at: 1.0,
            },
        }
    }

    fn policy() -> Policy {
        NotifyConfig::default().policy()
    }

    #[test]
    fn two_hundreds_deliver_everything_else_retries_or_dies() {
        let c = claimed(1, 1000.0);
        let ok = Answer::Status {
            code: 204,
            retry_after: None,
        };
        assert_eq!(
            decide(&ok, &c, &policy(), 1000.0, 0.5),
            Outcome::Delivered { status: 204 }
        );
        let five = Answer::Status {
            code: 500,
            retry_after: Some(Duration::from_secs(99)),
        };
        // Retry-After on a 500 means nothing: the jittered backoff applies (below 2 s).
        match decide(&five, &c, &policy(), 1000.0, 0.5) {
            Outcome::Retry {
                after,
                status: Some(500),
                ..
            } => assert_eq!(after, Duration::from_secs(1)),
            o => panic!("{o:?}"),
        }
        let busy = Answer::Status {
            code: 429,
            retry_after: Some(Duration::from_secs(7)),
        };
        match decide(&busy, &c, &policy(), 1000.0, 0.5) {
            Outcome::Retry { after, .. } => assert_eq!(after, Duration::from_secs(7)),
            o => panic!("{o:?}"),
        }
        let gone = Answer::Failed("no answer".into());
        let old = claimed(3, 1000.0);
        assert!(matches!(
            decide(&gone, &old, &policy(), 1000.0 + 24.0 * 3600.0, 0.5),
            Outcome::Dead { status: None, .. }
        ));
    }

    #[test]
    fn redirects_are_failures() {
        let c = claimed(1, 0.0);
        let moved = Answer::Status {
            code: StatusCode::MOVED_PERMANENTLY.as_u16(),
            retry_after: None,
        };
        assert!(matches!(
            decide(&moved, &c, &policy(), 0.0, 0.0),
            Outcome::Retry { .. }
        ));
    }
}
