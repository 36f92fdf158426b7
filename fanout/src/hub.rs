//! The viewers of one gateway process, by order, and the last point of each order. The source
//! hands every `track/<order>` point here: a lock, a few queue pushes, a wake-up; never I/O.

use crate::events::Tally;
use crate::queue::{Offer, PointQueue};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// One connected viewer as the hub sees it.
#[derive(Debug)]
pub(crate) struct Viewer {
    pub order: Arc<str>,
    queue: Mutex<PointQueue>,
    /// Woken when a point was queued.
    pub ready: Notify,
    /// Cancelled when the order ends: the session closes.
    pub ended: CancellationToken,
}

impl Viewer {
    fn lock(&self) -> MutexGuard<'_, PointQueue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves every waiting point into `out`.
    pub(crate) fn take(&self, out: &mut Vec<Bytes>) {
        self.lock().take(out);
    }

    /// Stops delivery (UNSUBSCRIBE).
    pub(crate) fn deactivate(&self) {
        self.lock().deactivate();
    }

    /// Queues the last known position unless a live point is already waiting.
    pub(crate) fn offer_initial(&self, p: Bytes) {
        if self.lock().offer_initial(p) {
            self.ready.notify_one();
        }
    }
}

#[derive(Debug, Default)]
struct OrderEntry {
    last: Option<Bytes>,
    touched: Option<Instant>,
    viewers: Vec<Arc<Viewer>>,
}

#[derive(Debug, Default)]
struct Inner {
    orders: HashMap<Arc<str>, OrderEntry>,
    /// Orders ended recently: a viewer that passed the Redis check just before the end was
    /// announced is still refused here.
    ended: HashMap<Arc<str>, Instant>,
}

/// The order was ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ended;

#[derive(Debug, Default)]
pub(crate) struct Hub {
    inner: Mutex<Inner>,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a viewer of `order` (it receives nothing until [`Hub::activate`]).
    pub(crate) fn join(
        &self,
        order: &str,
        queue_capacity: usize,
        latest_only: bool,
    ) -> Result<Arc<Viewer>, Ended> {
        let mut g = self.lock();
        if g.ended.contains_key(order) {
            return Err(Ended);
        }
        let order: Arc<str> = Arc::from(order);
        let v = Arc::new(Viewer {
            order: order.clone(),
            queue: Mutex::new(PointQueue::new(queue_capacity, latest_only)),
            ready: Notify::new(),
            ended: CancellationToken::new(),
        });
        g.orders.entry(order).or_default().viewers.push(v.clone());
        Ok(v)
    }

    /// Starts delivery to `v` and returns the order's last point, atomically with respect to
    /// [`Hub::dispatch`]: no point falls between the two.
    pub(crate) fn activate(&self, v: &Arc<Viewer>) -> Option<Bytes> {
        let g = self.lock();
        v.lock().activate();
        g.orders.get(&v.order).and_then(|e| e.last.clone())
    }

    pub(crate) fn leave(&self, v: &Arc<Viewer>) {
        let mut g = self.lock();
        if let Some(e) = g.orders.get_mut(&v.order) {
            e.viewers.retain(|x| !Arc::ptr_eq(x, v));
            if e.viewers.is_empty() && e.last.is_none() {
                g.orders.remove(&v.order);
            }
        }
    }

    /// A point of `order`: kept as its last, offered to each subscribed viewer.
    pub(crate) fn dispatch(&self, order: &str, payload: Bytes, now: Instant, tally: &mut Tally) {
        tally.tracks += 1;
        let mut g = self.lock();
        if g.ended.contains_key(order) {
            return;
        }
        let e = match g.orders.get_mut(order) {
            Some(e) => e,
            None => g.orders.entry(Arc::from(order)).or_default(),
        };
        e.touched = Some(now);
        for v in &e.viewers {
            match v.lock().offer(payload.clone()) {
                Offer::Inactive => continue,
                Offer::Queued => {}
                Offer::DroppedOldest => tally.dropped_queue_full += 1,
                Offer::Superseded => tally.superseded += 1,
            }
            v.ready.notify_one();
        }
        e.last = Some(payload);
    }

    /// Ends `order` here: its viewers are told to close, its last point is forgotten, and new
    /// viewers of it are refused. Returns how many viewers were told, or `None` when the
    /// order had ended here already (the API call and its announcement both arrive).
    pub(crate) fn end(&self, order: &str, now: Instant) -> Option<usize> {
        let mut g = self.lock();
        let order: Arc<str> = Arc::from(order);
        if g.ended.insert(order.clone(), now).is_some() {
            return None;
        }
        let Some(e) = g.orders.remove(&order) else {
            return Some(0);
        };
        for v in &e.viewers {
            v.ended.cancel();
        }
        Some(e.viewers.len())
    }

    /// Orders with at least one viewer.
    pub(crate) fn watched_orders(&self) -> Vec<String> {
        self.lock()
            .orders
            .iter()
            .filter(|(_, e)| !e.viewers.is_empty())
            .map(|(o, _)| o.to_string())
            .collect()
    }

    /// Forgets ended orders and unwatched last points older than `keep` (bounded memory).
    pub(crate) fn prune(&self, now: Instant, keep: Duration) {
        let mut g = self.lock();
        g.ended.retain(|_, t| now.duration_since(*t) < keep);
        g.orders.retain(|_, e| {
            !e.viewers.is_empty() || e.touched.is_some_and(|t| now.duration_since(t) < keep)
        });
    }

    #[cfg(test)]
    fn is_ended(&self, order: &str) -> bool {
        self.lock().ended.contains_key(order)
    }

    /// (orders known, ended orders remembered).
    #[cfg(test)]
    fn sizes(&self) -> (usize, usize) {
        let g = self.lock();
        (g.orders.len(), g.ended.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn points_reach_only_the_subscribed_viewers_of_their_order() {
        let hub = Hub::default();
        let now = Instant::now();
        let mut t = Tally::default();
        let a = hub.join("o1", 4, false).unwrap();
        let b = hub.join("o2", 4, false).unwrap();
        hub.dispatch("o1", p("early"), now, &mut t);
        assert_eq!(hub.activate(&a), Some(p("early")));
        hub.activate(&b);
        hub.dispatch("o1", p("x"), now, &mut t);
        let (mut ga, mut gb) = (vec![], vec![]);
        a.take(&mut ga);
        b.take(&mut gb);
        assert_eq!(ga, [p("x")]);
        assert!(gb.is_empty());
        assert_eq!(t.tracks, 2);
    }

    #[test]
    fn a_slow_viewer_loses_its_oldest_points_and_the_fast_one_nothing() {
        let hub = Hub::default();
        let now = Instant::now();
        let mut t = Tally::default();
        let slow = hub.join("o1", 2, false).unwrap();
        let fast = hub.join("o1", 2, false).unwrap();
        hub.activate(&slow);
        hub.activate(&fast);
        let mut got = vec![];
        for n in 0..5 {
            hub.dispatch("o1", p(&n.to_string()), now, &mut t);
            fast.take(&mut got);
        }
        assert_eq!(got.len(), 5);
        let mut s = vec![];
        slow.take(&mut s);
        assert_eq!(s, [p("3"), p("4")]);
        assert_eq!(t.dropped_queue_full, 3);
    }

    #[test]
    fn ending_an_order_kicks_its_viewers_and_refuses_new_ones() {
        let hub = Hub::default();
        let now = Instant::now();
        let a = hub.join("o1", 4, false).unwrap();
        let other = hub.join("o2", 4, false).unwrap();
        assert_eq!(hub.end("o1", now), Some(1));
        assert_eq!(hub.end("o1", now), None);
        assert!(a.ended.is_cancelled());
        assert!(!other.ended.is_cancelled());
        assert_eq!(hub.join("o1", 4, false).unwrap_err(), Ended);
        let mut t = Tally::default();
        hub.dispatch("o1", p("late"), now, &mut t);
        assert_eq!(hub.watched_orders(), ["o2"]);
        hub.prune(now + Duration::from_secs(10), Duration::from_secs(5));
        assert!(!hub.is_ended("o1"));
    }

    #[test]
    fn leaving_and_pruning_bound_the_memory() {
        let hub = Hub::default();
        let now = Instant::now();
        let mut t = Tally::default();
        let a = hub.join("o1", 4, false).unwrap();
        hub.leave(&a);
        assert_eq!(hub.sizes(), (0, 0));
        hub.dispatch("o9", p("x"), now, &mut t);
        assert_eq!(hub.sizes(), (1, 0));
        hub.prune(now + Duration::from_secs(10), Duration::from_secs(5));
        assert_eq!(hub.sizes(), (0, 0));
    }
}
