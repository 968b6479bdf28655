// Functions called with constant arguments, built by tests/const_values.rs
// with rustc -C opt-level=1/2 -g: LLVM drops the constant arguments and
// DWARF describes them with DW_AT_const_value (`a` of add, `k` of mul,
// `a` of pick) and computed locations (`b` of add: DW_OP_lit1;
// DW_OP_stack_value; `b` of pick: DW_OP_breg5 RDI+0 ... DW_OP_stack_value,
// in rdi where the ABI would put `a`). Each call logs its arguments on
// stderr as `CALL name(args)`, formatted first and written at once
// (eprintln! writes each piece apart, and hotprobe's own stderr lines
// could land between them).

#[inline(never)]
fn log<T: std::fmt::Display + Copy>(name: &str, a: i64, b: T) {
    use std::io::Write;
    let line = format!("CALL {name}({a}, {b})\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

#[inline(never)]
fn add(a: i32, b: bool) -> i32 {
    log("add", i64::from(a), b);
    if b {
        a + 1
    } else {
        a - 1
    }
}

#[inline(never)]
fn mul(a: i64, k: i64) -> i64 {
    log("mul", a, k);
    a * k
}

#[inline(never)]
fn pick(a: i64, b: bool) -> i64 {
    log("pick", a, b);
    if b {
        a + 1
    } else {
        a - 1
    }
}

fn main() {
    let n = std::env::args().count() as i64;
    let mut s = 0i64;
    s += i64::from(add(21, true));
    s += i64::from(add(21, true));
    s += mul(n + 6, 3);
    s += mul(n + 9, 3);
    s += pick(21, n > 0);
    s += pick(21, n > 5);
    println!("sum {s}");
}
