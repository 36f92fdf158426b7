//! The totals in the operations map's corner, read from the pipeline's own metrics (the text
//! `/metrics` serves, rendered in-process): pure parsing here, so it is tested without network.

use serde::Serialize;

/// The sum of `name`'s samples in Prometheus text, over the samples whose labels contain
/// `label` (`key="value"`) when given. `None` when no sample matched (the role does not run in
/// this process).
pub(crate) fn sum(text: &str, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    let want = label.map(|(k, v)| format!("{k}=\"{v}\""));
    let mut total = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        // `name_bucket` or `name2` share the prefix: the name must end here.
        let (labels, value) = match rest.as_bytes().first() {
            Some(b'{') => match rest.find('}') {
                Some(end) => (&rest[1..end], &rest[end + 1..]),
                None => continue,
            },
            Some(b' ') => ("", rest),
            _ => continue,
        };
        if let Some(w) = &want {
            if !labels.split(',').any(|l| l.trim() == w) {
                continue;
            }
        }
        if let Some(v) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *total.get_or_insert(0.0) += v;
        }
    }
    total
}

/// Loss counters since the process started (absent: that role does not run here).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct Loss {
    /// Points the ingest queue refused (`ingest_queue_dropped_total`).
    pub ingest_queue_dropped: Option<f64>,
    /// Payloads refused as invalid (`ingest_invalid_total`).
    pub invalid: Option<f64>,
    /// Track messages not published (`ingest_tracks_dropped_total`).
    pub tracks_dropped: Option<f64>,
    /// History rows dropped while PostgreSQL was slow or down (`history_rows_dropped_total`).
    pub history_dropped: Option<f64>,
    /// The embedded bus's loss alerts (`broker_cursor_jumps_total`).
    pub broker_cursor_jumps: Option<f64>,
    /// Points not sent to slow viewers (`fanout_points_dropped_total`).
    pub viewer_points_dropped: Option<f64>,
}

impl Loss {
    pub(crate) fn from_metrics(text: &str) -> Loss {
        use courier_wire::metrics as m;
        Loss {
            ingest_queue_dropped: sum(text, m::INGEST_QUEUE_DROPPED, None),
            invalid: sum(text, m::INGEST_INVALID, None),
            tracks_dropped: sum(text, m::INGEST_TRACKS_DROPPED, None),
            history_dropped: sum(text, m::HISTORY_ROWS_DROPPED, None),
            broker_cursor_jumps: sum(text, m::BROKER_CURSOR_JUMPS, None),
            viewer_points_dropped: sum(text, m::FANOUT_POINTS_DROPPED, None),
        }
    }
}

/// Accepted points so far (`ingest_points_total{result="accepted"}`).
pub(crate) fn accepted(text: &str) -> Option<f64> {
    sum(
        text,
        courier_wire::metrics::INGEST_POINTS,
        Some(("result", "accepted")),
    )
}

/// Points per second between two readings of a counter.
pub(crate) fn rate(before: (f64, f64), after: (f64, f64)) -> Option<f64> {
    let dt = after.0 - before.0;
    (dt > 0.0 && after.1 >= before.1).then(|| (after.1 - before.1) / dt)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE ingest_points_total counter\n\
        ingest_points_total{result=\"accepted\"} 120\n\
        ingest_points_total{result=\"stale\"} 3\n\
        ingest_points_total_extra 99\n\
        ingest_invalid_total{reason=\"not_json\"} 2\n\
        ingest_invalid_total{reason=\"range\"} 5\n\
        history_rows_dropped_total 0\n\
        ingest_queue_dropped_total{reason=\"queue_full\",x=\"y\"} 7 1700000000\n";

    #[test]
    fn sums_the_samples_of_one_name() {
        assert_eq!(accepted(TEXT), Some(120.0));
        assert_eq!(sum(TEXT, "ingest_points_total", None), Some(123.0));
        let loss = Loss::from_metrics(TEXT);
        assert_eq!(loss.invalid, Some(7.0));
        assert_eq!(loss.history_dropped, Some(0.0));
        assert_eq!(loss.ingest_queue_dropped, Some(7.0));
        // Not in this process: absent, not zero.
        assert_eq!(loss.viewer_points_dropped, None);
        assert_eq!(accepted(""), None);
    }

    #[test]
    fn rate_needs_time_and_a_counter_that_did_not_reset() {
        assert_eq!(rate((10.0, 100.0), (12.0, 300.0)), Some(100.0));
        assert_eq!(rate((10.0, 100.0), (10.0, 300.0)), None);
        assert_eq!(rate((10.0, 100.0), (11.0, 5.0)), None);
    }
}
