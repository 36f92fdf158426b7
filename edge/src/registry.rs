//! Who is connected, by courier id: one session per courier (a new login takes over the old
//! one, whose Will is NOT published: it would say `offline` after the new `online`), and the
//! courier's rate-limit bucket, which survives a takeover so that reconnecting does not refill it,
//! and whether he is off shift (his own `offline`), which survives his disconnecting too: an
//! off-shift courier's entry stays, without a connection, until his next `online`.
//! Sharded mutexes: a lookup per point at tens of thousands of points a second.

use crate::policy::{Bucket, Rate};
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Why a connected session is told to end: one wake-up for both, so that a session waits on
/// one notification rather than two.
#[derive(Default)]
pub(crate) struct Kick {
    notify: Notify,
    /// 0: another login took over; 1: the edge is stopping.
    why: AtomicU8,
}

impl Kick {
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Whether the edge is stopping (else: a takeover).
    pub(crate) fn stopping(&self) -> bool {
        self.why.load(Relaxed) == 1
    }

    fn send(&self, stopping: bool) {
        self.why.store(stopping as u8, Relaxed);
        self.notify.notify_one();
    }
}

const SHARDS: usize = 64;

type Shard = Mutex<HashMap<Box<str>, Entry>>;

struct Entry {
    /// The connection that holds it; `NO_CONN` for an off-shift courier gone.
    conn: u64,
    kick: Arc<Kick>,
    bucket: Bucket,
    off_shift: bool,
}

/// No connection ids reach it (they count up from 0).
const NO_CONN: u64 = u64::MAX;

/// The outcome of [`Registry::take`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Take {
    /// Forward it.
    Ok,
    /// Over the courier's rate.
    Empty,
    /// A point of a courier off shift: dropped at the door.
    OffShift,
    /// The connection is no longer his.
    NotHis,
}

pub(crate) struct Registry {
    hasher: RandomState,
    shards: Box<[Shard]>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl Registry {
    fn shard(&self, courier: &str) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Entry>> {
        let i = self.hasher.hash_one(courier) as usize % SHARDS;
        // A panic while holding a shard lock cannot leave an entry half-written: recover.
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers connection `conn` as `courier`'s; returns `true` when it took over
    /// another connection (which is told through its `kick`).
    pub(crate) fn claim(
        &self,
        courier: &str,
        conn: u64,
        kick: Arc<Kick>,
        rate: Rate,
        now: f64,
    ) -> bool {
        debug_assert_ne!(conn, NO_CONN);
        let mut shard = self.shard(courier);
        match shard.get_mut(courier) {
            // Off shift and gone: he comes back, still off shift, taking over no one.
            Some(e) if e.conn == NO_CONN => {
                e.conn = conn;
                e.kick = kick;
                e.bucket = Bucket::full(rate, now);
                false
            }
            Some(e) => {
                e.kick.send(false);
                e.conn = conn;
                e.kick = kick;
                true
            }
            None => {
                shard.insert(
                    courier.into(),
                    Entry {
                        conn,
                        kick,
                        bucket: Bucket::full(rate, now),
                        off_shift: false,
                    },
                );
                false
            }
        }
    }

    /// Takes one message's token from `courier`'s bucket. A `point` of a courier off shift is
    /// refused before it takes a token.
    pub(crate) fn take(&self, courier: &str, conn: u64, point: bool, rate: Rate, now: f64) -> Take {
        match self.shard(courier).get_mut(courier) {
            Some(e) if e.conn == conn => {
                if point && e.off_shift {
                    Take::OffShift
                } else if e.bucket.take(rate, now) {
                    Take::Ok
                } else {
                    Take::Empty
                }
            }
            _ => Take::NotHis,
        }
    }

    /// Records the courier's own `offline` (`true`) or `online` (`false`).
    pub(crate) fn set_off_shift(&self, courier: &str, conn: u64, off: bool) {
        if let Some(e) = self.shard(courier).get_mut(courier) {
            if e.conn == conn {
                e.off_shift = off;
            }
        }
    }

    /// Forgets `courier` if `conn` is still his connection; an off-shift courier stays known
    /// (without a connection) so that he is still off shift when he comes back.
    pub(crate) fn release(&self, courier: &str, conn: u64) {
        let mut shard = self.shard(courier);
        match shard.get_mut(courier) {
            Some(e) if e.conn == conn && e.off_shift => {
                e.conn = NO_CONN;
                e.kick = Arc::default();
            }
            Some(e) if e.conn == conn => {
                shard.remove(courier);
            }
            _ => {}
        }
    }

    /// Tells every connected session that the edge is stopping.
    pub(crate) fn stop_all(&self) {
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for e in shard.values().filter(|e| e.conn != NO_CONN) {
                e.kick.send(true);
            }
        }
    }

    /// Couriers connected.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: Rate = Rate {
        per_second: 1.0,
        burst: 3.0,
    };

    #[test]
    fn a_second_login_takes_over_and_keeps_the_bucket() {
        let r = Registry::default();
        let (k1, k2) = (Arc::new(Kick::default()), Arc::new(Kick::default()));
        assert!(!r.claim("c1", 1, k1.clone(), RATE, 0.0));
        assert_eq!(r.take("c1", 1, true, RATE, 0.0), Take::Ok);
        assert_eq!(r.take("c1", 1, true, RATE, 0.0), Take::Ok);
        assert!(r.claim("c1", 2, k2.clone(), RATE, 0.0));
        // The old connection was told, and may take nothing more.
        assert!(futures_util::FutureExt::now_or_never(k1.notified()).is_some());
        assert!(!k1.stopping());
        assert_eq!(r.take("c1", 1, true, RATE, 0.0), Take::NotHis);
        // The new one inherits the bucket: one token left, not a fresh three.
        assert_eq!(r.take("c1", 2, true, RATE, 0.0), Take::Ok);
        assert_eq!(r.take("c1", 2, true, RATE, 0.0), Take::Empty);
        // The old one leaving does not remove the new one.
        r.release("c1", 1);
        assert_eq!(r.len(), 1);
        r.stop_all();
        assert!(k2.stopping());
        r.release("c1", 2);
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn off_shift_drops_points_and_outlives_the_connection_until_online() {
        let r = Registry::default();
        let k = || Arc::new(Kick::default());
        r.claim("c1", 1, k(), RATE, 0.0);
        r.set_off_shift("c1", 1, true);
        assert_eq!(r.take("c1", 1, true, RATE, 0.0), Take::OffShift);
        // Statuses still go through (and take a token); points took none.
        assert_eq!(r.take("c1", 1, false, RATE, 0.0), Take::Ok);
        // Gone and back: still off shift, and no takeover.
        r.release("c1", 1);
        assert_eq!(r.len(), 1);
        assert!(!r.claim("c1", 2, k(), RATE, 0.0));
        assert_eq!(r.take("c1", 2, true, RATE, 0.0), Take::OffShift);
        r.set_off_shift("c1", 2, false);
        assert_eq!(r.take("c1", 2, true, RATE, 0.0), Take::Ok);
        // On shift, leaving forgets him.
        r.release("c1", 2);
        assert_eq!(r.len(), 0);
    }
}
