//! A typed capture from C (`hotprobe_record_typed`, `hotprobe_typed_take`):
//! a program compiled here with -g calls `work(int, double, const char *)`
//! 4 times and logs each call's arguments and result; the values the
//! capture hands back are those, call by call, with the default mechanism
//! and on traps. What the program printed is unchanged.

mod c_session;
mod common;
use c_session::*;
use common::*;
use hotprobe_c::*;
use std::ffi::{c_void, CStr, CString};
use std::ptr::null;

/// The events a handler got: (probe, is_return, values).
type Got = Vec<(u32, bool, Vec<String>)>;

unsafe extern "C" fn collect(ev: *const hotprobe_typed_event, user: *mut c_void) {
    // SAFETY: the library passes a valid event for the call and our `Got`.
    let (ev, got) = unsafe { (&*ev, &mut *(user as *mut Got)) };
    let values = (0..ev.nvalues)
        .map(|i| {
            // SAFETY: `nvalues` C strings, valid during the call.
            unsafe { CStr::from_ptr(*ev.values.add(i)) }
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    got.push((ev.probe, ev.is_return, values));
}

/// What the program logged, as the capture should show it: per call, the
/// entry's values (every parameter in order, unlabelled; or the expressions
/// `named` gives, labelled) and the return value.
fn logged(printed: &str, named: bool) -> Vec<(Vec<String>, String)> {
    printed
        .lines()
        .map(|l| {
            // "work I D S = R" (S may hold a space or be empty).
            let rest = l.strip_prefix("work ").expect("a work line");
            let (args, r) = rest.rsplit_once(" = ").expect("= R");
            let mut it = args.splitn(3, ' ');
            let (i, d, s) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
            let d: f64 = d.parse().unwrap();
            let values = if named {
                vec![format!("s=\"{s}\""), format!("i={i}")]
            } else {
                vec![i.to_string(), d.to_string(), format!("\"{s}\"")]
            };
            (values, r.to_string())
        })
        .collect()
}

fn capture(mechanism: u32, spec: &str) -> (Got, u32, String) {
    let dir = scratch(&format!("typed-{mechanism}-{}", spec.len()));
    let src = root().join("crates/hotprobe-capi/tests/programs/typed.c");
    let prog = gcc(&src, &dir.join("typed"), &["-O1", "-g"]);
    let out_path = dir.join("out");
    let out = std::fs::File::create(&out_path).unwrap();
    let (s, t) = open_and_spawn(mechanism, &prog, &out);
    let spec = CString::new(spec).unwrap();
    let (mut n, mut id) = (0usize, u32::MAX);
    let mut got: Got = Vec::new();
    let mut taken = 0usize;
    // SAFETY: live session, C strings, writable outs, a handler and its
    // `Got`.
    unsafe {
        let rc = hotprobe_record_typed(s, t, spec.as_ptr(), &mut id, 1, &mut n);
        assert_eq!(rc, HOTPROBE_OK, "{}", last_error());
        assert_eq!(n, 1);
        assert_eq!(hotprobe_run(s), HOTPROBE_END_EXITED, "{}", last_error());
        let user = &mut got as *mut Got as *mut c_void;
        let rc = hotprobe_typed_take(s, Some(collect), user, &mut taken);
        assert_eq!(rc, HOTPROBE_OK, "{}", last_error());
        // Taken: a second call has none.
        let mut again = usize::MAX;
        assert_eq!(hotprobe_typed_take(s, None, user, &mut again), HOTPROBE_OK);
        assert_eq!(again, 0);
        hotprobe_close(s);
    }
    assert_eq!(taken, got.len());
    (got, id, std::fs::read_to_string(&out_path).unwrap())
}

fn check(mechanism: u32, spec: &str) {
    let (got, id, printed) = capture(mechanism, spec);
    let calls = logged(&printed, spec.contains('('));
    assert_eq!(calls.len(), 4, "the program's output: {printed}");
    let mut want = Vec::new();
    for (args, ret) in calls {
        want.push((id, false, args));
        want.push((id, true, vec![ret]));
    }
    assert_eq!(got, want, "the program printed:\n{printed}");
}

#[test]
fn a_typed_capture_with_the_default_mechanism() {
    check(HOTPROBE_MECH_AUTO, "work");
}

#[test]
fn a_typed_capture_of_named_parameters() {
    check(HOTPROBE_MECH_AUTO, "work(s, i)");
}

#[test]
fn a_typed_capture_on_traps() {
    check(HOTPROBE_MECH_TRAP, "work");
}

#[test]
fn bad_argument_names_are_refused() {
    let dir = scratch("typed-bad");
    let src = root().join("crates/hotprobe-capi/tests/programs/typed.c");
    let prog = gcc(&src, &dir.join("typed"), &["-O1", "-g"]);
    // SAFETY: the defaults.
    let s = unsafe { hotprobe_open(null()) };
    assert!(!s.is_null(), "{}", last_error());
    let path = CString::new(prog.to_str().unwrap()).unwrap();
    let argv = [null()];
    let mut t = 0;
    // SAFETY: live session, C strings, writable outs.
    unsafe {
        let rc = hotprobe_spawn(s, path.as_ptr(), argv.as_ptr(), &mut t);
        assert_eq!(rc, HOTPROBE_OK, "{}", last_error());
        for (spec, says) in [
            (
                "work(nosuch)",
                "work has no parameter nosuch; its parameters: i (int32), d",
            ),
            ("work(i, s->)", "s->"),
            ("work%return", "without %return"),
        ] {
            let c = CString::new(spec).unwrap();
            let mut n = usize::MAX;
            let rc = hotprobe_record_typed(s, t, c.as_ptr(), std::ptr::null_mut(), 0, &mut n);
            assert_eq!(rc, HOTPROBE_ERR_INVALID, "{spec}");
            assert!(last_error().contains(says), "{spec}: {}", last_error());
            assert_eq!(n, usize::MAX, "{spec}: nothing placed");
        }
        hotprobe_close(s);
    }
}
