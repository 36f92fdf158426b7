//! A small log-linear histogram of non-negative integers (microseconds of delay): 32 buckets
//! per power of two, so any quantile is within about 3% of the exact value, in fixed memory.

const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
const LINEAR: u64 = 2 * SUB;
const BUCKETS: usize = (LINEAR + (64 - SUB_BITS as u64 - 1) * SUB) as usize;

#[derive(Debug, Clone)]
pub(crate) struct Histogram {
    counts: Box<[u64]>,
    total: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            total: 0,
            max: 0,
        }
    }
}

fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let shift = 63 - v.leading_zeros() - SUB_BITS;
    let top = v >> shift;
    (LINEAR + (shift as u64 - 1) * SUB + (top - SUB)) as usize
}

/// The middle of bucket `i`.
fn value(i: usize) -> u64 {
    let i = i as u64;
    if i < LINEAR {
        return i;
    }
    let shift = (i - LINEAR) / SUB + 1;
    let top = (i - LINEAR) % SUB + SUB;
    (top << shift) + (1u64 << shift) / 2
}

impl Histogram {
    pub(crate) fn record(&mut self, v: u64) {
        self.counts[index(v)] += 1;
        self.total += 1;
        self.max = self.max.max(v);
    }

    pub(crate) fn count(&self) -> u64 {
        self.total
    }

    pub(crate) fn max(&self) -> u64 {
        self.max
    }

    /// The value at quantile `q` (0..=1), or `None` when empty.
    pub(crate) fn quantile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        if rank >= self.total {
            return Some(self.max);
        }
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(value(i).min(self.max));
            }
        }
        Some(self.max)
    }

    pub(crate) fn clear(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.total = 0;
        self.max = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_values_are_exact() {
        let mut h = Histogram::default();
        for v in 0..LINEAR {
            h.record(v);
        }
        assert_eq!(h.quantile(0.5), Some(LINEAR / 2 - 1));
        assert_eq!(h.quantile(1.0), Some(LINEAR - 1));
        assert_eq!(Histogram::default().quantile(0.5), None);
    }

    #[test]
    fn extreme_values_fit() {
        let mut h = Histogram::default();
        h.record(u64::MAX);
        h.record(0);
        assert_eq!(h.quantile(1.0), Some(u64::MAX));
        assert_eq!(h.count(), 2);
    }

    proptest! {
        #[test]
        fn quantiles_are_within_3_percent(mut vs in proptest::collection::vec(0u64..10_000_000, 1..500), q in 0.0f64..=1.0) {
            let mut h = Histogram::default();
            for v in &vs { h.record(*v); }
            vs.sort_unstable();
            let rank = ((q * vs.len() as f64).ceil() as usize).max(1);
            let exact = vs[rank - 1] as f64;
            let got = h.quantile(q).unwrap() as f64;
            prop_assert!((got - exact).abs() <= exact * 0.032 + 1.0, "q {} exact {} got {}", q, exact, got);
        }
    }
}
