//! Aggregations computed in the target (`count --hist=arg0`, `--lhist`,
//! `--by`): the tables the agent adds into on each hit of a site whose
//! action has [`crate::ACTION_AGG`], so that no event goes through a ring.
//!
//! The region sits at [`crate::Layout::agg_offset`], after the thread
//! slots, and has a fixed size ([`AGG_REGION_SIZE`]; only the pages used
//! are ever touched):
//!
//! ```text
//! +0               AggCtl (64 bytes; rest of the page reserved)
//! +AGG_RULES_OFF   AggRuleSlot[AGG_RULES]       probe id → what to aggregate
//! +AGG_KEYS_OFF    AggKeySlot[AGG_KEYS]         (probe, key) → count, for `--by`
//! +AGG_BUCKETS_OFF AtomicU64[AGG_BUCKET_WORDS]  histogram buckets, handed out per rule
//! ```
//!
//! The tracer writes a rule (all its fields, then `probe_plus1` with
//! `Release`) before the site that uses it is armed; the agent finds it by
//! probe id (`Acquire`). Buckets and key counts take locked adds (every
//! thread adds into the same words). The key table is open addressing
//! with a bounded probe sequence ([`AGG_PROBE_LIMIT`]): a slot is claimed
//! by a CAS of its tag (`CLAIMED`), its key written, then the tag set to
//! `READY` (`Release`). A hit that meets a slot being claimed moves on to
//! the next slot instead of waiting (lock-free), so one key may end up in
//! two slots: readers sum slots with the same key. A hit that finds no
//! slot, or no key to read, is counted in its rule's `uncounted`, which
//! the tracer reports: no hit is lost silently.

use core::mem::size_of;
use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use core::sync::atomic::{AtomicI64, AtomicU32, AtomicU64};

use crate::{AbiError, Shm, PAGE};

/// What a rule aggregates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AggKind {
    /// A log2 histogram of a value ([`log2_bucket`], [`AGG_LOG2_BUCKETS`]).
    Log2,
    /// A linear histogram: `[min, max)` in steps of `step`, with an
    /// underflow and an overflow bucket ([`linear_bucket`]).
    Linear {
        /// Lowest value of the first bucket.
        min: i64,
        /// End of the last bucket (exclusive).
        max: i64,
        /// Width of a bucket (> 0).
        step: u64,
    },
    /// A count per key.
    Keyed,
}

/// [`AggRule::source`]: argument register `n` (0–5: rdi, rsi, rdx, rcx,
/// r8, r9) is `AGG_SRC_ARG0 + n`.
pub const AGG_SRC_ARG0: u32 = 0;
/// [`AggRule::source`]: the Linux thread id.
pub const AGG_SRC_TID: u32 = 8;
/// [`AggRule::source`]: the return value (rax) of the call: added at its
/// return (a hooked return, or an exit placeholder), not at its entry.
pub const AGG_SRC_RETVAL: u32 = 10;
/// [`AggRule::source`]: the thread's command name (`PR_GET_NAME`, 16
/// bytes, as the key's two words).
pub const AGG_SRC_COMM: u32 = 9;

/// One aggregation, as the tracer defines it for a probe id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AggRule {
    /// Histogram or count per key.
    pub kind: AggKind,
    /// `AGG_SRC_*`: the value histogrammed, or the key.
    pub source: u32,
    /// How much of an argument register the value is (see [`narrow`]):
    /// its size in bytes (1, 2, 4; 0 or 8: the whole register), with
    /// [`AGG_SIGNED`] for a signed type.
    pub width: u32,
}

/// [`AggRule::width`] flag: the value is signed (sign-extended).
pub const AGG_SIGNED: u32 = 1 << 8;

/// The value of a `width`-wide argument (see [`AggRule::width`]) held in
/// register value `v`: the upper bytes the callee may not rely on are
/// cleared, or filled with the sign.
#[inline(always)]
pub const fn narrow(v: u64, width: u32) -> u64 {
    let bits = match width & 0xff {
        1 => 8,
        2 => 16,
        4 => 32,
        _ => return v,
    };
    let shift = 64 - bits;
    if width & AGG_SIGNED != 0 {
        (((v << shift) as i64) >> shift) as u64
    } else {
        (v << shift) >> shift
    }
}

impl AggRule {
    /// Buckets the rule's histogram has (0 for [`AggKind::Keyed`]), or
    /// `None` when its parameters are invalid (`min >= max`, `step` 0, or
    /// more than [`AGG_MAX_LINEAR`] buckets).
    pub fn buckets(&self) -> Option<usize> {
        match self.kind {
            AggKind::Log2 => Some(AGG_LOG2_BUCKETS),
            AggKind::Keyed => Some(0),
            AggKind::Linear { min, max, step } => {
                if min >= max || step == 0 {
                    return None;
                }
                let span = (max as i128 - min as i128) as u128;
                let n = span.div_ceil(step as u128);
                (n <= AGG_MAX_LINEAR as u128).then_some(n as usize + 2)
            }
        }
    }
}

/// Buckets of a log2 histogram: negative values, 0, 1, then `[2^k,
/// 2^(k+1))` for k in 1..=62.
pub const AGG_LOG2_BUCKETS: usize = 65;
/// Most in-range buckets a linear histogram may have.
pub const AGG_MAX_LINEAR: usize = 4096;

/// The log2 bucket of `v` (read as signed, as bpftrace does): 0 for
/// negative values, 1 for 0, `2 + floor(log2 v)` otherwise.
#[inline(always)]
pub const fn log2_bucket(v: i64) -> usize {
    if v < 0 {
        0
    } else if v == 0 {
        1
    } else {
        2 + (63 - v.leading_zeros() as usize)
    }
}

/// The values `[lo, hi)` of log2 bucket `i` (`lo` is `i64::MIN` for the
/// negative bucket; `hi` saturates at `i64::MAX`).
pub const fn log2_range(i: usize) -> (i64, i64) {
    match i {
        0 => (i64::MIN, 0),
        1 => (0, 1),
        _ => {
            let k = (i - 2) as u32;
            let lo = 1i64 << k;
            let hi = if k >= 62 { i64::MAX } else { 1i64 << (k + 1) };
            (lo, hi)
        }
    }
}

/// The bucket of `v` in a linear histogram of `nbuckets` buckets (see
/// [`AggRule::buckets`]): 0 below `min`, `nbuckets - 1` at `max` or
/// above, else `1 + (v - min) / step`.
#[inline(always)]
pub fn linear_bucket(v: i64, min: i64, max: i64, step: u64, nbuckets: usize) -> usize {
    if v < min {
        0
    } else if v >= max {
        nbuckets.saturating_sub(1)
    } else {
        let i = 1 + ((v as i128 - min as i128) as u128 / step.max(1) as u128) as usize;
        i.min(nbuckets.saturating_sub(2))
    }
}

/// Slots of the rule table (a power of two).
pub const AGG_RULES: usize = 4096;
/// Slots of the key table (a power of two).
pub const AGG_KEYS: usize = 1 << 16;
/// Words of the bucket pool.
pub const AGG_BUCKET_WORDS: usize = 1 << 18;
/// Key-table slots a hit tries before counting itself uncounted.
pub const AGG_PROBE_LIMIT: usize = 256;
/// Offset of the rule table in the region.
pub const AGG_RULES_OFF: usize = PAGE;
/// Offset of the key table in the region.
pub const AGG_KEYS_OFF: usize = AGG_RULES_OFF + AGG_RULES * size_of::<AggRuleSlot>();
/// Offset of the bucket pool in the region.
pub const AGG_BUCKETS_OFF: usize = AGG_KEYS_OFF + AGG_KEYS * size_of::<AggKeySlot>();
/// Bytes of the region.
pub const AGG_REGION_SIZE: usize = AGG_BUCKETS_OFF + AGG_BUCKET_WORDS * 8;

/// The region's control block.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct AggCtl {
    /// Bucket words handed out so far (tracer only).
    pub buckets_used: AtomicU64,
    /// Rules defined so far (tracer only).
    pub rules_used: AtomicU64,
}

/// One rule of the rule table (all atomics: written by the tracer before
/// `probe_plus1`, read by the agent after it).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct AggRuleSlot {
    /// Probe id + 1; 0 = empty. Published last (`Release`).
    pub probe_plus1: AtomicU32,
    /// 0 log2, 1 linear, 2 keyed.
    pub kind: AtomicU32,
    /// `AGG_SRC_*`.
    pub source: AtomicU32,
    /// Buckets of the histogram.
    pub nbuckets: AtomicU32,
    /// Index of the first bucket in the pool.
    pub first_bucket: AtomicU64,
    /// Linear: `min`.
    pub min: AtomicI64,
    /// Linear: `max`.
    pub max: AtomicI64,
    /// Linear: `step`.
    pub step: AtomicU64,
    /// See [`AggRule::width`].
    pub width: AtomicU32,
    /// Reserved, zero.
    pub reserved: AtomicU32,
    /// Hits not aggregated (agent, locked add): no key-table slot, a key
    /// that could not be read, a hit refused inside the agent.
    pub uncounted: AtomicU64,
}
const _: () = assert!(size_of::<AggRuleSlot>() == 64);

/// One slot of the key table.
#[repr(C)]
#[derive(Debug)]
pub struct AggKeySlot {
    /// 0 empty; else probe id + 1 in the low 32 bits with [`KEY_CLAIMED`]
    /// or [`KEY_READY`].
    pub tag: AtomicU64,
    /// First word of the key.
    pub k0: AtomicU64,
    /// Second word of the key (a comm's bytes 8–15; 0 otherwise).
    pub k1: AtomicU64,
    /// Hits of this key.
    pub count: AtomicU64,
}
const _: () = assert!(size_of::<AggKeySlot>() == 32);

/// [`AggKeySlot::tag`]: a thread is writing the key.
pub const KEY_CLAIMED: u64 = 1 << 62;
/// [`AggKeySlot::tag`]: the key is written.
pub const KEY_READY: u64 = 1 << 63;

const KIND_LOG2: u32 = 0;
const KIND_LINEAR: u32 = 1;
const KIND_KEYED: u32 = 2;

fn region(shm: &Shm) -> *mut u8 {
    // SAFETY: the layout puts the region inside the mapping
    // (agg_offset + AGG_REGION_SIZE == total_size <= len, validated).
    unsafe { shm.as_ptr().add(shm.layout().agg_offset) }
}

/// The region's control block.
pub fn ctl(shm: &Shm) -> &AggCtl {
    // SAFETY: in the mapping (see `region`), page-aligned, atomics only.
    unsafe { &*(region(shm) as *const AggCtl) }
}

/// The rule table.
pub fn rules(shm: &Shm) -> &[AggRuleSlot] {
    // SAFETY: AGG_RULES slots at AGG_RULES_OFF lie in the region, aligned.
    unsafe {
        core::slice::from_raw_parts(
            region(shm).add(AGG_RULES_OFF) as *const AggRuleSlot,
            AGG_RULES,
        )
    }
}

/// The key table.
pub fn keys(shm: &Shm) -> &[AggKeySlot] {
    // SAFETY: AGG_KEYS slots at AGG_KEYS_OFF lie in the region, aligned.
    unsafe {
        core::slice::from_raw_parts(region(shm).add(AGG_KEYS_OFF) as *const AggKeySlot, AGG_KEYS)
    }
}

fn bucket_pool(shm: &Shm) -> &[AtomicU64] {
    // SAFETY: AGG_BUCKET_WORDS words at AGG_BUCKETS_OFF lie in the region.
    unsafe {
        core::slice::from_raw_parts(
            region(shm).add(AGG_BUCKETS_OFF) as *const AtomicU64,
            AGG_BUCKET_WORDS,
        )
    }
}

/// The rule of probe `probe`, if one is defined.
#[inline(always)]
pub fn find_rule(shm: &Shm, probe: u32) -> Option<&AggRuleSlot> {
    let rules = rules(shm);
    let want = probe.wrapping_add(1);
    let mut i = probe as usize;
    for _ in 0..AGG_RULES {
        let r = rules.get(i & (AGG_RULES - 1))?;
        match r.probe_plus1.load(Acquire) {
            0 => return None,
            p if p == want => return Some(r),
            _ => i = i.wrapping_add(1),
        }
    }
    None
}

/// Defines the rule of probe `probe` (tracer side, before its site is
/// armed): its buckets come from the pool.
pub fn define(shm: &Shm, probe: u32, rule: AggRule) -> Result<(), AbiError> {
    let nbuckets = rule
        .buckets()
        .ok_or(AbiError::BadParams("invalid linear histogram"))?;
    if find_rule(shm, probe).is_some() {
        return Err(AbiError::BadParams("the probe has an aggregation already"));
    }
    let c = ctl(shm);
    if c.rules_used.load(Relaxed) as usize >= AGG_RULES / 2 {
        return Err(AbiError::BadParams("too many aggregating probes"));
    }
    let first = c.buckets_used.load(Relaxed);
    if first as usize + nbuckets > AGG_BUCKET_WORDS {
        return Err(AbiError::BadParams("the aggregation bucket pool is full"));
    }
    let rules = rules(shm);
    let mut i = probe as usize;
    let slot = loop {
        let r = &rules[i & (AGG_RULES - 1)];
        if r.probe_plus1.load(Relaxed) == 0 {
            break r;
        }
        i = i.wrapping_add(1);
    };
    let (kind, min, max, step) = match rule.kind {
        AggKind::Log2 => (KIND_LOG2, 0, 0, 0),
        AggKind::Linear { min, max, step } => (KIND_LINEAR, min, max, step),
        AggKind::Keyed => (KIND_KEYED, 0, 0, 0),
    };
    slot.kind.store(kind, Relaxed);
    slot.source.store(rule.source, Relaxed);
    slot.nbuckets.store(nbuckets as u32, Relaxed);
    slot.first_bucket.store(first, Relaxed);
    slot.min.store(min, Relaxed);
    slot.max.store(max, Relaxed);
    slot.step.store(step, Relaxed);
    slot.width.store(rule.width, Relaxed);
    c.buckets_used.store(first + nbuckets as u64, Relaxed);
    c.rules_used.fetch_add(1, Relaxed);
    // Pairs with the Acquire of `find_rule` in the agent.
    slot.probe_plus1.store(probe.wrapping_add(1), Release);
    Ok(())
}

/// The rule of a slot, decoded.
pub fn rule_of(slot: &AggRuleSlot) -> AggRule {
    let kind = match slot.kind.load(Relaxed) {
        KIND_LINEAR => AggKind::Linear {
            min: slot.min.load(Relaxed),
            max: slot.max.load(Relaxed),
            step: slot.step.load(Relaxed),
        },
        KIND_KEYED => AggKind::Keyed,
        _ => AggKind::Log2,
    };
    AggRule {
        kind,
        source: slot.source.load(Relaxed),
        width: slot.width.load(Relaxed),
    }
}

/// The buckets of a rule (empty for keyed rules).
pub fn buckets<'a>(shm: &'a Shm, slot: &AggRuleSlot) -> &'a [AtomicU64] {
    let first = slot.first_bucket.load(Relaxed) as usize;
    let n = slot.nbuckets.load(Relaxed) as usize;
    bucket_pool(shm)
        .get(first..first.saturating_add(n))
        .unwrap_or(&[])
}

/// Adds a hit of value `v` into a histogram rule (agent side).
#[inline(always)]
pub fn add_value(shm: &Shm, slot: &AggRuleSlot, v: i64) {
    let n = slot.nbuckets.load(Relaxed) as usize;
    let i = match slot.kind.load(Relaxed) {
        KIND_LINEAR => linear_bucket(
            v,
            slot.min.load(Relaxed),
            slot.max.load(Relaxed),
            slot.step.load(Relaxed),
            n,
        ),
        _ => log2_bucket(v),
    };
    match buckets(shm, slot).get(i) {
        Some(b) => {
            b.fetch_add(1, Relaxed);
        }
        None => {
            slot.uncounted.fetch_add(1, Relaxed);
        }
    }
}

#[inline(always)]
fn key_hash(probe: u32, k0: u64, k1: u64) -> usize {
    let h = (k0 ^ k1.rotate_left(29) ^ (probe as u64) << 40).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 32) as usize
}

/// Adds a hit of key `(k0, k1)` of probe `probe` into the key table
/// (agent side); a hit that finds no slot is counted in the rule's
/// `uncounted`.
#[inline(always)]
pub fn add_key(shm: &Shm, slot: &AggRuleSlot, probe: u32, k0: u64, k1: u64) {
    let table = keys(shm);
    let p1 = probe.wrapping_add(1) as u64;
    let ready = KEY_READY | p1;
    let mut i = key_hash(probe, k0, k1);
    for _ in 0..AGG_PROBE_LIMIT {
        let Some(s) = table.get(i & (AGG_KEYS - 1)) else {
            break;
        };
        i = i.wrapping_add(1);
        // Pairs with the Release store of READY below (another thread's).
        let mut tag = s.tag.load(Acquire);
        if tag == 0 {
            match s
                .tag
                .compare_exchange(0, KEY_CLAIMED | p1, Acquire, Acquire)
            {
                Ok(_) => {
                    s.k0.store(k0, Relaxed);
                    s.k1.store(k1, Relaxed);
                    s.count.fetch_add(1, Relaxed);
                    // Pairs with the Acquire loads of the tag.
                    s.tag.store(ready, Release);
                    return;
                }
                Err(now) => tag = now,
            }
        }
        if tag == ready && s.k0.load(Relaxed) == k0 && s.k1.load(Relaxed) == k1 {
            s.count.fetch_add(1, Relaxed);
            return;
        }
    }
    slot.uncounted.fetch_add(1, Relaxed);
}

/// Adds a hit into the rule `slot` of probe `probe` (agent side): key
/// `(k0, k1)` for a keyed rule, else value `k0` (read as signed).
#[inline(always)]
pub fn add_hit(shm: &Shm, slot: &AggRuleSlot, probe: u32, k0: u64, k1: u64) {
    if slot.kind.load(Relaxed) == KIND_KEYED {
        add_key(shm, slot, probe, k0, k1);
    } else {
        add_value(shm, slot, k0 as i64);
    }
}

/// Calls `f(k0, k1, count)` for every key of probe `probe` (tracer side;
/// a key may come more than once: sum them). Slots still being claimed
/// are counted in the second value returned... see [`claimed_hits`].
pub fn for_each_key(shm: &Shm, probe: u32, mut f: impl FnMut(u64, u64, u64)) {
    let ready = KEY_READY | probe.wrapping_add(1) as u64;
    for s in keys(shm) {
        if s.tag.load(Acquire) == ready {
            f(
                s.k0.load(Relaxed),
                s.k1.load(Relaxed),
                s.count.load(Relaxed),
            );
        }
    }
}

/// Every hit probe `probe`'s rule `slot` took: its buckets, its keys and
/// the hits it could not aggregate (tracer side).
pub fn rule_hits(shm: &Shm, slot: &AggRuleSlot, probe: u32) -> u64 {
    let mut n: u64 = buckets(shm, slot).iter().map(|b| b.load(Relaxed)).sum();
    for_each_key(shm, probe, |_, _, c| n += c);
    n + claimed_hits(shm, probe) + slot.uncounted.load(Relaxed)
}

/// Hits of probe `probe` in key-table slots whose claim never finished
/// (their thread died between the claim and the key's publication).
pub fn claimed_hits(shm: &Shm, probe: u32) -> u64 {
    let claimed = KEY_CLAIMED | probe.wrapping_add(1) as u64;
    keys(shm)
        .iter()
        .filter(|s| s.tag.load(Acquire) == claimed)
        .map(|s| s.count.load(Relaxed))
        .sum()
}
