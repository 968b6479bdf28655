//! The aggregation tables (`hotprobe_abi::agg`) under threads adding at
//! once: every hit is in a bucket, a key's slots (summed), or the rule's
//! `uncounted`; rules are found by probe id; bad rules are refused.

use std::alloc::{alloc_zeroed, dealloc, Layout as AllocLayout};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use hotprobe_abi::agg::*;
use hotprobe_abi::*;

struct Buf {
    ptr: *mut u8,
    layout: AllocLayout,
}
impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

fn make() -> (Buf, Shm) {
    let params = Params {
        n_probes: 16,
        n_site_slots: 32,
        n_threads: 2,
        ring_capacity: 8,
        event_size: EVENT_SIZE_COMPACT,
    };
    let l = Layout::new(params).unwrap();
    let layout = AllocLayout::from_size_align(l.total_size, 4096).unwrap();
    // SAFETY: non-zero size.
    let ptr = unsafe { alloc_zeroed(layout) };
    assert!(!ptr.is_null());
    // SAFETY: zeroed, page-aligned, lives as long as the Buf returned beside it.
    let shm = unsafe { Shm::create(ptr, l.total_size, params) }.unwrap();
    (Buf { ptr, layout }, shm)
}

const KEYED: AggRule = AggRule {
    kind: AggKind::Keyed,
    source: AGG_SRC_ARG0,
    width: 0,
};

#[test]
fn threads_adding_at_once_lose_no_hit() {
    let (_buf, shm) = make();
    define(&shm, 3, KEYED).unwrap();
    define(
        &shm,
        5,
        AggRule {
            kind: AggKind::Log2,
            source: AGG_SRC_ARG0,
            width: 0,
        },
    )
    .unwrap();
    let threads = 4u64;
    let per_thread = 20_000u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            let shm = &shm;
            s.spawn(move || {
                let keyed = find_rule(shm, 3).unwrap();
                let log2 = find_rule(shm, 5).unwrap();
                for i in 0..per_thread {
                    // 500 keys, every thread on all of them.
                    add_hit(shm, keyed, 3, (i + t) % 500, 0);
                    add_hit(shm, log2, 5, i, 0);
                }
            });
        }
    });
    let mut keys: HashMap<u64, u64> = HashMap::new();
    for_each_key(&shm, 3, |k0, _, n| *keys.entry(k0).or_default() += n);
    assert_eq!(keys.len(), 500);
    assert!(
        keys.values().all(|&n| n == threads * per_thread / 500),
        "{keys:?}"
    );
    let keyed = find_rule(&shm, 3).unwrap();
    assert_eq!(keyed.uncounted.load(Relaxed), 0);
    assert_eq!(claimed_hits(&shm, 3), 0);
    assert_eq!(rule_hits(&shm, keyed, 3), threads * per_thread);
    // The log2 buckets: each value's, `threads` times.
    let log2 = find_rule(&shm, 5).unwrap();
    let b: Vec<u64> = buckets(&shm, log2)
        .iter()
        .map(|b| b.load(Relaxed))
        .collect();
    assert_eq!(b.len(), AGG_LOG2_BUCKETS);
    let mut expected = vec![0u64; AGG_LOG2_BUCKETS];
    for i in 0..per_thread {
        expected[log2_bucket(i as i64)] += threads;
    }
    assert_eq!(b, expected);
    // No rule for probe 4; the other rules' keys are not probe 5's.
    assert!(find_rule(&shm, 4).is_none());
    let mut none = 0;
    for_each_key(&shm, 5, |_, _, _| none += 1);
    assert_eq!(none, 0);
}

#[test]
fn a_full_key_table_counts_the_rest_as_uncounted() {
    let (_buf, shm) = make();
    define(&shm, 1, KEYED).unwrap();
    let r = find_rule(&shm, 1).unwrap();
    let n = AGG_KEYS as u64 + 5_000;
    for k in 0..n {
        add_hit(&shm, r, 1, k, 0);
    }
    let mut stored = 0;
    for_each_key(&shm, 1, |_, _, c| stored += c);
    assert!(stored <= AGG_KEYS as u64);
    assert!(r.uncounted.load(Relaxed) >= 5_000);
    assert_eq!(stored + r.uncounted.load(Relaxed), n);
}

#[test]
fn bad_rules_and_a_second_rule_are_refused() {
    let (_buf, shm) = make();
    let linear = |min, max, step| AggRule {
        kind: AggKind::Linear { min, max, step },
        source: AGG_SRC_ARG0,
        width: 0,
    };
    assert!(define(&shm, 1, linear(10, 0, 1)).is_err());
    assert!(define(&shm, 1, linear(0, 10, 0)).is_err());
    assert!(define(&shm, 1, linear(0, 1 << 20, 1)).is_err());
    define(&shm, 1, linear(0, 100, 10)).unwrap();
    assert!(define(&shm, 1, KEYED).is_err());
    let r = find_rule(&shm, 1).unwrap();
    assert_eq!(rule_of(r), linear(0, 100, 10));
    // Underflow, the ten buckets, overflow.
    assert_eq!(buckets(&shm, r).len(), 12);
    for v in [-1i64, 0, 9, 10, 99, 100, i64::MAX] {
        add_value(&shm, r, v);
    }
    let b: Vec<u64> = buckets(&shm, r).iter().map(|b| b.load(Relaxed)).collect();
    assert_eq!(b, vec![1, 2, 1, 0, 0, 0, 0, 0, 0, 0, 1, 2]);
}

#[test]
fn narrow_keeps_a_parameters_own_bytes() {
    assert_eq!(narrow(0xdead_beef_ffff_fffd, 4 | AGG_SIGNED) as i64, -3);
    assert_eq!(narrow(0xdead_beef_ffff_fffd, 4), 0xffff_fffd);
    assert_eq!(narrow(0x1ff, 1), 0xff);
    assert_eq!(narrow(0x1ff, 1 | AGG_SIGNED) as i64, -1);
    assert_eq!(narrow(u64::MAX, 0), u64::MAX);
    assert_eq!(narrow(u64::MAX, 8), u64::MAX);
}
