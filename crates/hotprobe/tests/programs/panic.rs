//! leaf panics through mid (a Vec to drop) to top's catch_unwind every
//! fourth call. Prints its own counts.
use std::hint::black_box;
use std::panic;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
static CALLS: AtomicU32 = AtomicU32::new(0);
static RETURNS: AtomicU32 = AtomicU32::new(0);
#[no_mangle]
#[inline(never)]
pub fn leaf(i: u32) -> u32 {
    CALLS.fetch_add(1, Relaxed);
    if i % 4 == 0 {
        panic!("boom {i}");
    }
    RETURNS.fetch_add(1, Relaxed);
    black_box(i * 2)
}
#[no_mangle]
#[inline(never)]
pub fn mid(i: u32) -> u32 {
    let v = vec![i; 4];
    black_box(leaf(black_box(i))) + v[3] - i
}
#[no_mangle]
#[inline(never)]
pub fn top(i: u32) -> i64 {
    match panic::catch_unwind(|| mid(black_box(i))) {
        Ok(v) => v as i64,
        Err(_) => -1,
    }
}
fn main() {
    panic::set_hook(Box::new(|_| {}));
    let n: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(40);
    let mut sum = 0i64;
    for i in 0..n {
        sum += top(i);
    }
    println!("calls={} returns={} sum={}", CALLS.load(Relaxed), RETURNS.load(Relaxed), sum);
}
