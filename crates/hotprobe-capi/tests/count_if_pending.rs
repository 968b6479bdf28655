//! A conditional count from C on a library the program loads later
//! (dlopen): `hotprobe_count_if` places it pending, and its condition,
//! naming the function's parameter, compiles when the library is loaded
//! (each time: the CLI tests' dlopen_twice.c calls libtest.c's libfn(i)
//! for i = 0 .. 2, unloads the library, loads it again and calls libfn(i)
//! for i = 0 .. 3). A name the function lacks is said when the count is
//! read, never a silent zero.

mod c_session;
mod common;
use c_session::*;
use common::*;
use hotprobe_c::*;
use std::ffi::CString;

const OUTPUT: &str = "first libfn 3\nunloaded yes\nsecond libfn 4\ntotal libfn 7\n";

/// `hotprobe_count_if(s, t, "libtest.so:libfn", cond)` over a run of
/// dlopen_twice: (the return code and count of `hotprobe_count_if_hits`,
/// the last error, what the program printed).
fn count_if(cond: &str, tag: &str) -> (i32, u64, String, String) {
    let dir = scratch(&format!("count-if-pending-{tag}"));
    let cli = root().join("crates/hotprobe-cli/tests/programs");
    let so = hotprobe_testkit::compile(
        "gcc",
        &cli.join("libtest.c"),
        &dir.join("libtest.so"),
        &["-O1", "-g", "-shared", "-fPIC"],
        &[],
    );
    let prog = hotprobe_testkit::compile(
        "gcc",
        &cli.join("dlopen_twice.c"),
        &dir.join("dlopen_twice"),
        &["-O1", "-g"],
        &["-ldl"],
    );
    let out_path = dir.join("out");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut cfg = hotprobe_config {
        mechanism: 0,
        maxactive: 0,
        follow_forks: false,
        force: false,
    };
    // SAFETY: `cfg` is writable.
    unsafe { hotprobe_config_default(&mut cfg) };
    // SAFETY: a valid config.
    let s = unsafe { hotprobe_open(&cfg) };
    assert!(!s.is_null(), "{}", last_error());
    let t = spawn_into(s, &prog, &[so.to_str().unwrap()], &out);
    let spec = CString::new("libtest.so:libfn").unwrap();
    let cond = CString::new(cond).unwrap();
    let (mut id, mut n, mut hits) = (u32::MAX, 0usize, 0u64);
    // SAFETY: live session, C strings, writable outs.
    let rc = unsafe {
        let rc = hotprobe_count_if(s, t, spec.as_ptr(), cond.as_ptr(), &mut id, 1, &mut n);
        assert_eq!(rc, HOTPROBE_OK, "{}", last_error());
        assert_eq!(n, 1);
        assert_eq!(hotprobe_run(s), HOTPROBE_END_EXITED, "{}", last_error());
        hotprobe_count_if_hits(s, id, &mut hits)
    };
    let error = last_error();
    // SAFETY: a live session, closed once.
    unsafe { hotprobe_close(s) };
    (rc, hits, error, std::fs::read_to_string(&out_path).unwrap())
}

#[test]
fn a_condition_on_a_library_loaded_later_counts_from_c() {
    // x >= 1: 1, 2 of 0, 1, 2; 1, 2, 3 of 0, 1, 2, 3.
    let (rc, hits, error, printed) = count_if("x >= 1", "x");
    assert_eq!(rc, HOTPROBE_OK, "{error}");
    assert_eq!((hits, printed.as_str()), (5, OUTPUT));
}

#[test]
fn a_condition_that_does_not_compile_in_the_loaded_library_is_an_error_when_read() {
    let (rc, _, error, printed) = count_if("size >= 1", "size");
    assert_eq!(printed, OUTPUT);
    assert_eq!(rc, HOTPROBE_ERR_REFUSED, "{error}");
    assert!(
        error.ends_with(
            "`libtest.so:libfn if size >= 1`: the condition: libfn has no parameter size; its \
             parameters: x; its hits are not counted"
        ),
        "{error}"
    );
}
