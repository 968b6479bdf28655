//! Latency histograms with power-of-two buckets, printed like bpftrace's
//! `hist()`:
//!
//! ```text
//! [512ns, 1us)          3 |@@@                                                 |
//! [1us, 2us)           52 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
//! [2us, 4us)            7 |@@@@@@@                                             |
//! ```
//!
//! The buckets double within each decimal unit, so that their bounds read
//! as round numbers: `[0]` (exactly 0 ns), `[1ns, 2ns)`, … `[256ns, 512ns)`,
//! `[512ns, 1us)`, `[1us, 2us)`, … `[512ms, 1s)`, then `[1s, 2s)`,
//! `[2s, 4s)` and on. The last bucket of a unit, `[512, 1000)`, is a little
//! narrower than the others.

use serde::{Serialize, Serializer};

/// Decimal units: ns, µs, ms (seconds double on without a bound).
const UNITS: [u64; 4] = [1, 1_000, 1_000_000, 1_000_000_000];
/// Buckets per decimal unit below seconds (1, 2, … 512).
const PER_UNIT: usize = 10;

/// Counts of durations (ns) per bucket, with their count, sum, min and max.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    /// Calls whose exit was lost: no duration, in no bucket.
    no_exit: u64,
    sum_ns: u64,
    min_ns: u64,
    max_ns: u64,
}

/// One bucket: `[lo_ns, hi_ns)` holds `count` values (`[0, 1)` is `[0]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// Lower bound (inclusive), ns.
    pub lo_ns: u64,
    /// Upper bound (exclusive), ns.
    pub hi_ns: u64,
    /// Values in it.
    pub count: u64,
}

/// The bucket index of a value.
fn index(ns: u64) -> usize {
    if ns == 0 {
        return 0;
    }
    let u = UNITS
        .iter()
        .rposition(|&u| ns >= u)
        .unwrap_or(0)
        .min(UNITS.len() - 1);
    let k = (ns / UNITS[u]).ilog2() as usize;
    1 + u * PER_UNIT + k
}

/// The bounds of bucket `i`.
fn bounds(i: usize) -> (u64, u64) {
    if i == 0 {
        return (0, 1);
    }
    let u = ((i - 1) / PER_UNIT).min(UNITS.len() - 1);
    let k = (i - 1 - u * PER_UNIT) as u32;
    let unit = UNITS[u];
    let lo = unit.saturating_mul(1u64.checked_shl(k).unwrap_or(u64::MAX));
    let mut hi = unit.saturating_mul(1u64.checked_shl(k + 1).unwrap_or(u64::MAX));
    if u + 1 < UNITS.len() {
        hi = hi.min(UNITS[u + 1]);
    }
    (lo, hi)
}

/// `512ns`, `1us`, `250ms`, `2s`: the largest unit dividing `ns`.
pub fn fmt_bound(ns: u64) -> String {
    if ns == 0 {
        return "0".into();
    }
    let names = ["ns", "us", "ms", "s"];
    let u = UNITS
        .iter()
        .rposition(|&u| ns >= u && ns.is_multiple_of(u))
        .unwrap_or(0);
    format!("{}{}", ns / UNITS[u], names[u])
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Histogram {
        Histogram::default()
    }

    /// Counts a call whose exit was lost (its duration is not known: it
    /// goes in no bucket and no statistic).
    pub fn add_no_exit(&mut self) {
        self.no_exit += 1;
    }

    /// Calls whose exit was lost ([`Histogram::add_no_exit`]).
    pub fn no_exit(&self) -> u64 {
        self.no_exit
    }

    /// Adds one duration.
    pub fn add(&mut self, ns: u64) {
        let i = index(ns);
        if self.counts.len() <= i {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += 1;
        self.min_ns = if self.count == 0 {
            ns
        } else {
            self.min_ns.min(ns)
        };
        self.max_ns = self.max_ns.max(ns);
        self.count += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    /// Adds every value of another histogram.
    pub fn merge(&mut self, o: &Histogram) {
        if o.count == 0 {
            return;
        }
        if self.counts.len() < o.counts.len() {
            self.counts.resize(o.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.min_ns = if self.count == 0 {
            o.min_ns
        } else {
            self.min_ns.min(o.min_ns)
        };
        self.max_ns = self.max_ns.max(o.max_ns);
        self.count += o.count;
        self.sum_ns = self.sum_ns.saturating_add(o.sum_ns);
    }

    /// Values added.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Their sum (ns).
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns
    }

    /// The smallest (0 when empty).
    pub fn min_ns(&self) -> u64 {
        self.min_ns
    }

    /// The largest (0 when empty).
    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// The average (0 when empty).
    pub fn avg_ns(&self) -> u64 {
        self.sum_ns / self.count.max(1)
    }

    /// The buckets from the first non-empty one to the last, empty ones
    /// between included (as bpftrace prints them).
    pub fn buckets(&self) -> Vec<Bucket> {
        let Some(first) = self.counts.iter().position(|&c| c > 0) else {
            return Vec::new();
        };
        let last = self.counts.iter().rposition(|&c| c > 0).unwrap_or(first);
        (first..=last)
            .map(|i| {
                let (lo_ns, hi_ns) = bounds(i);
                Bucket {
                    lo_ns,
                    hi_ns,
                    count: self.counts[i],
                }
            })
            .collect()
    }

    /// The bucket lines (`[1us, 2us)   12 |@@@@   |`, bars 52 wide scaled
    /// to the fullest bucket), each ending with a newline.
    pub fn to_text(&self) -> String {
        let buckets = self.buckets();
        let top = buckets.iter().map(|b| b.count).max().unwrap_or(0).max(1);
        let mut s = String::new();
        for b in buckets {
            let label = if b.lo_ns == 0 {
                "[0]".to_string()
            } else {
                format!("[{}, {})", fmt_bound(b.lo_ns), fmt_bound(b.hi_ns))
            };
            let bar = "@".repeat((b.count * 52 / top) as usize);
            s.push_str(&format!("{label:<16}{:>8} |{bar:<52}|\n", b.count));
        }
        s
    }
}

impl Serialize for Histogram {
    /// `{"count", "sum_ns", "min_ns", "max_ns", "avg_ns", "no_exit",
    /// "buckets": [{"lo_ns", "hi_ns", "count"}]}`.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct H {
            count: u64,
            sum_ns: u64,
            min_ns: u64,
            max_ns: u64,
            avg_ns: u64,
            no_exit: u64,
            buckets: Vec<Bucket>,
        }
        H {
            count: self.count,
            no_exit: self.no_exit,
            sum_ns: self.sum_ns,
            min_ns: self.min_ns,
            max_ns: self.max_ns,
            avg_ns: self.avg_ns(),
            buckets: self.buckets(),
        }
        .serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_read_as_round_numbers() {
        let b = |ns| bounds(index(ns));
        assert_eq!(b(0), (0, 1));
        assert_eq!(b(1), (1, 2));
        assert_eq!(b(3), (2, 4));
        assert_eq!(b(511), (256, 512));
        assert_eq!(b(512), (512, 1000));
        assert_eq!(b(999), (512, 1000));
        assert_eq!(b(1000), (1000, 2000));
        assert_eq!(b(1999), (1000, 2000));
        assert_eq!(b(999_999), (512_000, 1_000_000));
        assert_eq!(b(1_000_000), (1_000_000, 2_000_000));
        assert_eq!(b(2_500_000), (2_000_000, 4_000_000));
        assert_eq!(b(1_500_000_000), (1_000_000_000, 2_000_000_000));
        assert_eq!(b(5_000_000_000), (4_000_000_000, 8_000_000_000));
        assert_eq!(b(u64::MAX), (1_000_000_000 << 34, u64::MAX));
        // Every value lies in its bucket.
        for v in (0..64)
            .map(|s| 1u64 << s)
            .chain([7, 999, 1001, 123_456_789])
        {
            let (lo, hi) = b(v);
            assert!(lo <= v && (v < hi || hi == u64::MAX), "{v}: [{lo}, {hi})");
        }
        assert_eq!(fmt_bound(512), "512ns");
        assert_eq!(fmt_bound(1000), "1us");
        assert_eq!(fmt_bound(4_000_000), "4ms");
        assert_eq!(fmt_bound(2_000_000_000), "2s");
    }

    #[test]
    fn text_like_bpftrace() {
        let mut h = Histogram::new();
        for v in [1500, 1200, 1900, 3000, 700] {
            h.add(v);
        }
        let t = h.to_text();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[0].starts_with("[512ns, 1us)"), "{t}");
        assert!(
            lines[1].starts_with("[1us, 2us)             3 |@@@@"),
            "{t}"
        );
        assert!(lines[1].ends_with("@|"), "{t}");
        assert!(
            lines[2].starts_with("[2us, 4us)             1 |@@@@"),
            "{t}"
        );
        assert_eq!((h.count(), h.min_ns(), h.max_ns()), (5, 700, 3000));
        let j = serde_json::to_value(&h).unwrap();
        assert_eq!(j["buckets"][1]["lo_ns"], 1000);
        assert_eq!(j["buckets"][1]["count"], 3);
        let mut m = Histogram::new();
        m.merge(&h);
        m.merge(&h);
        assert_eq!(
            (m.count(), m.min_ns(), m.sum_ns()),
            (10, 700, 2 * h.sum_ns())
        );
    }
}
