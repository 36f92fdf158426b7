//! The per-viewer send queue, with no I/O: bounded, it drops the OLDEST point when full (a
//! map only needs the newest), and with a send interval it keeps only the newest point.

use bytes::Bytes;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What happened to an offered point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offer {
    Queued,
    /// Queued; the oldest waiting point was dropped to make room (a slow viewer).
    DroppedOldest,
    /// Queued; it replaced a point not yet sent within the send interval.
    Superseded,
    /// The viewer has not subscribed (yet): nothing queued, nothing counted.
    Inactive,
}

/// Points waiting for one viewer.
#[derive(Debug)]
pub(crate) struct PointQueue {
    buf: VecDeque<Bytes>,
    cap: usize,
    latest_only: bool,
    active: bool,
}

impl PointQueue {
    /// `latest_only`: a send interval is set, so only the newest waiting point matters.
    pub(crate) fn new(cap: usize, latest_only: bool) -> Self {
        PointQueue {
            buf: VecDeque::new(),
            cap: if latest_only { 1 } else { cap.max(1) },
            latest_only,
            active: false,
        }
    }

    pub(crate) fn activate(&mut self) {
        self.active = true;
    }

    /// Stops delivery (UNSUBSCRIBE) and forgets what waits.
    pub(crate) fn deactivate(&mut self) {
        self.active = false;
        self.buf.clear();
    }

    pub(crate) fn offer(&mut self, p: Bytes) -> Offer {
        if !self.active {
            return Offer::Inactive;
        }
        let outcome = if self.buf.len() >= self.cap {
            self.buf.pop_front();
            if self.latest_only {
                Offer::Superseded
            } else {
                Offer::DroppedOldest
            }
        } else {
            Offer::Queued
        };
        self.buf.push_back(p);
        outcome
    }

    /// The last known position right after SUBSCRIBE, unless a live point got there first.
    pub(crate) fn offer_initial(&mut self, p: Bytes) -> bool {
        if self.buf.is_empty() {
            self.buf.push_back(p);
            true
        } else {
            false
        }
    }

    /// Moves every waiting point, oldest first, into `out`.
    pub(crate) fn take(&mut self, out: &mut Vec<Bytes>) {
        out.extend(self.buf.drain(..));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.buf.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// At most one send per interval.
#[derive(Debug, Clone)]
pub(crate) struct Pacer {
    interval: Duration,
    next: Option<Instant>,
}

impl Pacer {
    pub(crate) fn new(interval: Duration) -> Self {
        Pacer {
            interval,
            next: None,
        }
    }

    /// `Ok` when a send may happen at `now` (and books the next slot), else when it may.
    pub(crate) fn ready(&mut self, now: Instant) -> Result<(), Instant> {
        if self.interval.is_zero() {
            return Ok(());
        }
        match self.next {
            Some(t) if now < t => Err(t),
            _ => {
                self.next = Some(now + self.interval);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n: u8) -> Bytes {
        Bytes::from(vec![n])
    }

    #[test]
    fn a_full_queue_drops_the_oldest_and_says_so() {
        let mut q = PointQueue::new(3, false);
        assert_eq!(q.offer(p(0)), Offer::Inactive);
        q.activate();
        for n in 1..=3 {
            assert_eq!(q.offer(p(n)), Offer::Queued);
        }
        assert_eq!(q.offer(p(4)), Offer::DroppedOldest);
        assert_eq!(q.offer(p(5)), Offer::DroppedOldest);
        let mut out = vec![];
        q.take(&mut out);
        assert_eq!(out, [p(3), p(4), p(5)]);
        assert!(q.is_empty());
    }

    #[test]
    fn with_an_interval_only_the_newest_waits() {
        let mut q = PointQueue::new(16, true);
        q.activate();
        assert_eq!(q.offer(p(1)), Offer::Queued);
        assert_eq!(q.offer(p(2)), Offer::Superseded);
        let mut out = vec![];
        q.take(&mut out);
        assert_eq!(out, [p(2)]);
    }

    #[test]
    fn the_initial_position_never_overtakes_a_live_point() {
        let mut q = PointQueue::new(4, false);
        q.activate();
        assert!(q.offer_initial(p(9)));
        let mut q = PointQueue::new(4, false);
        q.activate();
        q.offer(p(1));
        assert!(!q.offer_initial(p(9)));
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn pacer_allows_one_send_per_interval() {
        let t0 = Instant::now();
        let mut every = Pacer::new(Duration::ZERO);
        assert!(every.ready(t0).is_ok() && every.ready(t0).is_ok());
        let mut pc = Pacer::new(Duration::from_secs(1));
        assert!(pc.ready(t0).is_ok());
        assert_eq!(
            pc.ready(t0 + Duration::from_millis(500)),
            Err(t0 + Duration::from_secs(1))
        );
        assert!(pc.ready(t0 + Duration::from_secs(1)).is_ok());
        assert!(pc.ready(t0 + Duration::from_millis(1500)).is_err());
    }
}
