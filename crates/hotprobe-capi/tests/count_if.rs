//! A conditional count from C (`hotprobe_count_if`): a program compiled
//! here calls `take` 10 times with known arguments, 5 of them above 256;
//! the count with `arg0 > 256` is 5, the unconditional count beside it 10,
//! on the fast path and on traps. Bad conditions are refused with the
//! column. Conditions may name the function's parameters (from its
//! DWARF): tests/programs/params.c calls `put(int key, unsigned size)` 8
//! times, and `key < 0`, `size > 256` count exactly the calls that match.

mod c_session;
mod common;
use c_session::*;
use common::*;
use hotprobe_c::*;
use std::ffi::CString;
use std::ptr::{null, null_mut};

/// The test program (tests/programs/sizes.c), built into `dir`.
fn sizes(dir: &std::path::Path) -> std::path::PathBuf {
    let src = root().join("crates/hotprobe-capi/tests/programs/sizes.c");
    gcc(&src, &dir.join("sizes"), &["-O1", "-g"])
}

/// Runs the program under a session with `mechanism`: (conditional count,
/// unconditional count with `hotprobe_count`, unconditional count with
/// `hotprobe_count_if` and no condition, what the program printed).
fn counts(mechanism: u32) -> (u64, u64, u64, String) {
    let dir = scratch(&format!("count-if-{mechanism}"));
    let prog = sizes(&dir);
    let out_path = dir.join("out");
    let out = std::fs::File::create(&out_path).unwrap();
    let (s, t) = open_and_spawn(mechanism, &prog, &out);
    let spec = CString::new("take").unwrap();
    let cond = CString::new("arg0 > 256").unwrap();
    let mut n = 0usize;
    let (mut cond_id, mut all_id, mut count_id) = (u32::MAX, u32::MAX, u32::MAX);
    // SAFETY: live session, C strings, writable outs.
    unsafe {
        let rc = hotprobe_count_if(s, t, spec.as_ptr(), cond.as_ptr(), &mut cond_id, 1, &mut n);
        assert_eq!(rc, HOTPROBE_OK, "{}", last_error());
        assert_eq!(n, 1);
        let rc = hotprobe_count_if(s, t, spec.as_ptr(), null(), &mut all_id, 1, &mut n);
        assert_eq!(rc, HOTPROBE_OK, "{}", last_error());
        assert_eq!(n, 1);
        let rc = hotprobe_count(s, t, spec.as_ptr(), &mut count_id, 1, &mut n);
        assert_eq!(rc, HOTPROBE_OK, "{}", last_error());
        assert_eq!(n, 1);
        assert_eq!(hotprobe_run(s), HOTPROBE_END_EXITED, "{}", last_error());
    }
    let (mut cond_hits, mut all_hits, mut lost) = (u64::MAX, u64::MAX, u64::MAX);
    let mut st = hotprobe_stats::default();
    // SAFETY: live session, writable outs.
    unsafe {
        assert_eq!(
            hotprobe_count_if_hits(s, cond_id, &mut cond_hits),
            HOTPROBE_OK
        );
        assert_eq!(
            hotprobe_count_if_hits(s, all_id, &mut all_hits),
            HOTPROBE_OK
        );
        assert_eq!(hotprobe_stats_of(s, count_id, &mut st), HOTPROBE_OK);
        assert_eq!(hotprobe_count_if_lost(s, &mut lost), HOTPROBE_OK);
        // A plain count is no conditional count.
        let rc = hotprobe_count_if_hits(s, count_id, null_mut());
        assert_eq!(rc, HOTPROBE_ERR_NOT_FOUND);
        hotprobe_close(s);
    }
    assert_eq!(lost, 0);
    let printed = std::fs::read_to_string(&out_path).unwrap();
    (cond_hits, all_hits, st.hits, printed)
}

#[test]
fn a_conditional_count_on_the_fast_path() {
    // 300, 1000, 257, 4096, 999 of 0, 100, 300, 1000, 256, 257, -5, 4096,
    // 1, 999.
    assert_eq!(
        counts(HOTPROBE_MECH_AUTO),
        (5, 10, 10, "total 7004\n".into())
    );
}

#[test]
fn a_conditional_count_on_traps() {
    assert_eq!(
        counts(HOTPROBE_MECH_TRAP),
        (5, 10, 10, "total 7004\n".into())
    );
}

#[test]
fn bad_conditions_are_refused_before_anything_is_placed() {
    let dir = scratch("count-if-bad");
    let prog = sizes(&dir);
    // SAFETY: NULL is the default config.
    let s = unsafe { hotprobe_open(null()) };
    assert!(!s.is_null(), "{}", last_error());
    let path = CString::new(prog.to_str().unwrap()).unwrap();
    let argv = [null()];
    let mut t = 0;
    // SAFETY: live session, C strings, NULL-terminated argv.
    let rc = unsafe { hotprobe_spawn_io(s, path.as_ptr(), argv.as_ptr(), -1, -1, -1, &mut t) };
    assert_eq!(rc, HOTPROBE_OK, "{}", last_error());
    let cases = [
        (
            "take",
            "arg0 >",
            "the condition: column 7: expected an argument",
        ),
        (
            "take",
            "arg6 == 1",
            "the condition: column 1: arg6 does not exist",
        ),
        (
            "take",
            "size > 1",
            "the condition: take has no parameter size; its parameters: n",
        ),
        (
            "take%return",
            "arg0 > 1",
            "take%return: conditions and histograms work on function entries",
        ),
    ];
    for (spec, cond, want) in cases {
        let spec = CString::new(spec).unwrap();
        let cond = CString::new(cond).unwrap();
        let mut n = usize::MAX;
        // SAFETY: live session, C strings, writable out.
        let rc =
            unsafe { hotprobe_count_if(s, t, spec.as_ptr(), cond.as_ptr(), null_mut(), 0, &mut n) };
        assert_eq!(rc, HOTPROBE_ERR_INVALID, "{cond:?}");
        assert!(last_error().starts_with(want), "{}", last_error());
        assert_eq!(n, usize::MAX, "nothing placed");
    }
    // SAFETY: live session; NULL spec refused.
    let rc = unsafe { hotprobe_count_if(s, t, null(), null(), null_mut(), 0, null_mut()) };
    assert_eq!(rc, HOTPROBE_ERR_INVALID);
    assert_eq!(last_error(), "spec is NULL");
    // SAFETY: the handle is not used again (the program runs on).
    unsafe {
        assert_eq!(hotprobe_run(s), HOTPROBE_END_EXITED, "{}", last_error());
        hotprobe_close(s);
    }
}

/// The test program (tests/programs/params.c), built into `dir` with
/// `flags`.
fn params(dir: &std::path::Path, name: &str, flags: &[&str]) -> std::path::PathBuf {
    let src = root().join("crates/hotprobe-capi/tests/programs/params.c");
    gcc(&src, &dir.join(name), flags)
}

/// Places `hotprobe_count_if(s, t, spec, cond)`: its one probe id, or the
/// error code and message.
fn count_if(
    s: *mut hotprobe_session,
    t: hotprobe_target,
    spec: &str,
    cond: &str,
) -> Result<u32, (i32, String)> {
    let spec = CString::new(spec).unwrap();
    let cond = CString::new(cond).unwrap();
    let (mut id, mut n) = (u32::MAX, usize::MAX);
    // SAFETY: live session, C strings, writable outs (room for one id).
    let rc = unsafe { hotprobe_count_if(s, t, spec.as_ptr(), cond.as_ptr(), &mut id, 1, &mut n) };
    if rc != HOTPROBE_OK {
        assert_eq!(n, usize::MAX, "nothing placed");
        return Err((rc, last_error()));
    }
    assert_eq!(n, 1);
    Ok(id)
}

/// The calls a conditional count counted.
fn hits(s: *mut hotprobe_session, id: u32) -> u64 {
    let mut hits = u64::MAX;
    // SAFETY: live session, writable out.
    let rc = unsafe { hotprobe_count_if_hits(s, id, &mut hits) };
    assert_eq!(rc, HOTPROBE_OK, "{}", last_error());
    hits
}

/// Conditions naming `put`'s parameters on tests/programs/params.c (keys
/// 1, -2, 3, -4, 5, 6, -7, 8; sizes 100, 300, 4096, 0, 257, 256, 1000,
/// 4000000000): (key < 0, size > 256, size > 256 && key > 0,
/// key == 3 || arg1 == 0, the program's output).
fn named_counts(mechanism: u32) -> (u64, u64, u64, u64, String) {
    let dir = scratch(&format!("count-if-named-{mechanism}"));
    let prog = params(&dir, "params", &["-O1", "-g"]);
    let out_path = dir.join("out");
    let out = std::fs::File::create(&out_path).unwrap();
    let (s, t) = open_and_spawn(mechanism, &prog, &out);
    let negative = count_if(s, t, "put", "key < 0").unwrap();
    let big = count_if(s, t, "put", "size > 256").unwrap();
    let both = count_if(s, t, "put", "size > 256 && key > 0").unwrap();
    let mixed = count_if(s, t, "put", "key == 3 || arg1 == 0").unwrap();
    // SAFETY: live session.
    let end = unsafe { hotprobe_run(s) };
    assert_eq!(end, HOTPROBE_END_EXITED, "{}", last_error());
    let mut lost = u64::MAX;
    // SAFETY: live session, writable out.
    assert_eq!(unsafe { hotprobe_count_if_lost(s, &mut lost) }, HOTPROBE_OK);
    assert_eq!(lost, 0);
    let counts = (
        hits(s, negative),
        hits(s, big),
        hits(s, both),
        hits(s, mixed),
    );
    // SAFETY: the handle is not used again.
    unsafe { hotprobe_close(s) };
    let printed = std::fs::read_to_string(&out_path).unwrap();
    (counts.0, counts.1, counts.2, counts.3, printed)
}

#[test]
fn conditions_name_parameters_on_the_fast_path() {
    // key < 0: -2, -4, -7. size > 256 (unsigned: 4000000000 too): 300,
    // 4096, 257, 1000, 4000000000; with key > 0: 4096, 257, 4000000000.
    // key == 3 || arg1 == 0: the third and the fourth call.
    assert_eq!(
        named_counts(HOTPROBE_MECH_AUTO),
        (3, 5, 3, 2, "sum 10\n".into())
    );
}

#[test]
fn conditions_name_parameters_on_traps() {
    assert_eq!(
        named_counts(HOTPROBE_MECH_TRAP),
        (3, 5, 3, 2, "sum 10\n".into())
    );
}

#[test]
fn unknown_parameters_and_no_dwarf_are_refused_and_nothing_stays_placed() {
    let dir = scratch("count-if-named-bad");
    let with_dwarf = params(&dir, "params", &["-O1", "-g"]);
    let without = params(&dir, "params-nodebug", &["-O1", "-g0"]);
    for (prog, cond, want) in [
        (
            &with_dwarf,
            "nosuch > 1",
            "the condition: put has no parameter nosuch; its parameters: key, size",
        ),
        (
            &with_dwarf,
            "key > 1 &&",
            "the condition: column 11: expected an argument",
        ),
        (
            &without,
            "key < 0",
            "the condition names a parameter, and put has no DWARF (build with -g)",
        ),
    ] {
        let out_path = dir.join("out");
        let out = std::fs::File::create(&out_path).unwrap();
        let (s, t) = open_and_spawn(HOTPROBE_MECH_AUTO, prog, &out);
        // Counts placed before and after the refusal count every call;
        // the probe ids between them (the refused condition's, ids are
        // handed out in order) are gone.
        let before = count_if(s, t, "put", "arg0 == arg0").unwrap();
        let (rc, msg) = count_if(s, t, "put", cond).unwrap_err();
        assert_eq!(rc, HOTPROBE_ERR_INVALID, "{cond}");
        assert!(msg.starts_with(want), "{cond}: {msg}");
        let after = count_if(s, t, "put", "arg0 == arg0").unwrap();
        // SAFETY: live session.
        let end = unsafe { hotprobe_run(s) };
        assert_eq!(end, HOTPROBE_END_EXITED, "{}", last_error());
        assert_eq!((hits(s, before), hits(s, after)), (8, 8), "{cond}");
        let placed_between = cond != "key > 1 &&";
        assert_eq!(
            after - before > 1,
            placed_between,
            "{cond}: {before} {after}"
        );
        for id in before + 1..after {
            // SAFETY: live session.
            let rc = unsafe { hotprobe_unregister(s, id) };
            assert_eq!(rc, HOTPROBE_ERR_NOT_FOUND, "{cond}: probe {id} is left");
        }
        // SAFETY: the handle is not used again.
        unsafe { hotprobe_close(s) };
        assert_eq!(std::fs::read_to_string(&out_path).unwrap(), "sum 10\n");
    }
}
