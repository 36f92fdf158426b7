//! Pure: the bounded buffer between the MQTT receive loop and PostgreSQL. When full, the
//! OLDEST rows make room and are counted: during an outage the newest `capacity` rows are
//! kept, and memory never grows past the bound. A batch that failed goes back to the front,
//! so rows leave the buffer only by being written or by being counted as dropped.

use std::collections::VecDeque;

/// Queue slots kept allocated however empty the buffer gets.
const KEEP_CAPACITY: usize = 65_536;

/// A FIFO of at most `capacity` items that drops from the front when full.
#[derive(Debug)]
pub(crate) struct Bounded<T> {
    items: VecDeque<T>,
    capacity: usize,
    dropped: u64,
}

impl<T> Bounded<T> {
    pub fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "capacity is validated to be at least 1");
        Bounded {
            items: VecDeque::new(),
            capacity,
            dropped: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The oldest item.
    pub(crate) fn front(&self) -> Option<&T> {
        self.items.front()
    }

    /// Appends `item`, dropping the oldest when full; returns how many were dropped (0 or 1).
    pub(crate) fn push(&mut self, item: T) -> u64 {
        let mut n = 0;
        if self.items.len() == self.capacity {
            self.items.pop_front();
            n = 1;
        }
        self.items.push_back(item);
        self.dropped += n;
        n
    }

    /// Takes up to `max` of the oldest items.
    pub(crate) fn take(&mut self, max: usize) -> Vec<T> {
        let n = max.min(self.items.len());
        let batch = self.items.drain(..n).collect();
        // After an outage the queue may have grown to its bound; give the memory back once it
        // has drained well below that (rarely: only when under a quarter is in use).
        let cap = self.items.capacity();
        if cap > KEEP_CAPACITY && self.items.len() < cap / 4 {
            self.items
                .shrink_to((self.items.len() * 2).max(KEEP_CAPACITY));
        }
        batch
    }

    /// Puts a batch that could not be written back at the front, in its order; if that
    /// overfills the buffer, its oldest rows are dropped. Returns how many were dropped.
    pub(crate) fn requeue(&mut self, batch: Vec<T>) -> u64 {
        let room = self.capacity - self.items.len();
        let skip = batch.len().saturating_sub(room);
        for item in batch.into_iter().skip(skip).rev() {
            self.items.push_front(item);
        }
        self.dropped += skip as u64;
        skip as u64
    }

    /// Everything dropped since creation.
    #[cfg(test)]
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn full_buffer_drops_the_oldest() {
        let mut b = Bounded::new(3);
        for i in 0..5 {
            b.push(i);
        }
        assert_eq!(b.dropped(), 2);
        assert_eq!(b.take(10), vec![2, 3, 4]);
    }

    #[test]
    fn a_failed_batch_goes_back_in_front_of_newer_rows() {
        let mut b = Bounded::new(4);
        for i in 0..4 {
            b.push(i);
        }
        let batch = b.take(3);
        b.push(4);
        b.push(5);
        // 0,1,2 back in front of 3,4,5: room for one, so the two oldest go.
        assert_eq!(b.requeue(batch), 2);
        assert_eq!(b.take(10), vec![2, 3, 4, 5]);
        assert_eq!(b.dropped(), 2);
    }

    #[test]
    fn memory_is_given_back_after_a_drain() {
        let mut b = Bounded::new(1_000_000);
        for i in 0..500_000u64 {
            b.push(i);
        }
        assert!(b.items.capacity() >= 500_000);
        while !b.take(20_000).is_empty() {}
        assert!(
            b.items.capacity() <= 2 * KEEP_CAPACITY,
            "{}",
            b.items.capacity()
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(u8),
        Take(u8),
        FailNext,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u8..50).prop_map(Op::Push),
            2 => (1u8..40).prop_map(Op::Take),
            1 => Just(Op::FailNext),
        ]
    }

    proptest! {
        /// Whatever the order of arrivals, writes and failures: every row is written exactly
        /// once or counted as dropped, the buffer never exceeds its bound, rows are written in
        /// arrival order, and only the oldest are ever dropped.
        #[test]
        fn every_row_is_written_or_counted(cap in 1usize..64, ops in proptest::collection::vec(op(), 0..200)) {
            let mut b = Bounded::new(cap);
            let mut next = 0u64;
            let mut written: Vec<u64> = Vec::new();
            let mut fail = false;
            for o in ops {
                match o {
                    Op::Push(n) => for _ in 0..n { b.push(next); next += 1; },
                    Op::FailNext => fail = true,
                    Op::Take(n) => {
                        let batch = b.take(n as usize);
                        if std::mem::take(&mut fail) { b.requeue(batch); } else { written.extend(batch); }
                    }
                }
                prop_assert!(b.len() <= cap);
            }
            written.extend(b.take(usize::MAX));
            prop_assert_eq!(written.len() as u64 + b.dropped(), next);
            prop_assert!(written.windows(2).all(|w| w[0] < w[1]), "order kept, nothing twice");
        }
    }
}
