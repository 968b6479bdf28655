//! The C API called as C would call it (through the `extern "C"` functions,
//! handlers `extern "C"` functions with `user_data`), on a program compiled
//! here: errors as codes with a message, register and memory access from
//! the handler context, stop from a handler, enable/disable, unregister,
//! stats.

mod c_session;
mod common;
use c_session::*;
use common::*;
use hotprobe_c::*;
use std::ffi::{c_void, CString};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::ptr::{null, null_mut};

/// The link-time (= run-time: -no-pie) address of a symbol, from nm.
fn nm(bin: &std::path::Path, sym: &str) -> u64 {
    let o = run_ok(Command::new("nm").arg(bin));
    let t = text(&o.stdout);
    let line = t
        .lines()
        .find(|l| l.split_whitespace().nth(2) == Some(sym))
        .unwrap_or_else(|| panic!("{sym} not in nm output"));
    u64::from_str_radix(line.split_whitespace().next().unwrap(), 16).unwrap()
}

#[derive(Default)]
struct State {
    /// Address of the program's global `last`.
    last_addr: u64,
    /// Arguments seen by the pre handler, in order.
    args: Vec<u64>,
    /// `last` as read by the return handler after each call.
    lasts: Vec<u64>,
    /// Stop the run at this many pre hits.
    stop_at: usize,
    /// Errors seen by handlers.
    errors: Vec<(i32, String)>,
    /// A session handle (as an address) the pre handler calls back into.
    reenter: usize,
    /// What those calls returned.
    reentered: Vec<(i32, String)>,
    /// What a read of one byte more than HOTPROBE_MAX_READ returned.
    too_long: Option<(i32, String)>,
}

unsafe extern "C" fn pre(ctx: *mut hotprobe_ctx, user: *mut c_void) {
    // SAFETY: `user` is the `State` the test registered, alive for the run.
    let st = unsafe { &mut *(user as *mut State) };
    let mut rdi = 0u64;
    // SAFETY: the running handler's context.
    let rc = unsafe { hotprobe_ctx_reg(ctx, HOTPROBE_REG_RDI, &mut rdi) };
    if rc != HOTPROBE_OK {
        st.errors.push((rc, last_error()));
    }
    // SAFETY: as above.
    assert_eq!(unsafe { hotprobe_ctx_kind(ctx) }, HOTPROBE_KIND_PRE);
    st.args.push(rdi);
    if st.reenter != 0 {
        // Calls into the session from its own handler are refused, not UB.
        let s = st.reenter as *mut hotprobe_session;
        // SAFETY: a live session (running: refused before use).
        let rc = unsafe { hotprobe_disable(s, 0) };
        st.reentered.push((rc, last_error()));
        // SAFETY: as above; ignored while running.
        unsafe { hotprobe_close(s) };
    }
    if st.args.len() == st.stop_at {
        // SAFETY: as above.
        unsafe { hotprobe_ctx_stop(ctx) };
    }
}

unsafe extern "C" fn ret(ctx: *mut hotprobe_ctx, user: *mut c_void) {
    // SAFETY: `user` is the `State` the test registered, alive for the run.
    let st = unsafe { &mut *(user as *mut State) };
    let mut v = [0u8; 8];
    // SAFETY: the running handler's context; `v` is 8 writable bytes.
    let rc = unsafe { hotprobe_ctx_read(ctx, st.last_addr, v.as_mut_ptr().cast(), 8) };
    if rc != HOTPROBE_OK {
        st.errors.push((rc, last_error()));
    }
    let last = u64::from_le_bytes(v);
    if st.too_long.is_none() {
        // One byte over the limit: refused, nothing read.
        let mut big = vec![0u8; HOTPROBE_MAX_READ + 1];
        // SAFETY: as above; `big` is that many writable bytes.
        let rc =
            unsafe { hotprobe_ctx_read(ctx, st.last_addr, big.as_mut_ptr().cast(), big.len()) };
        st.too_long = Some((rc, last_error()));
    }
    st.lasts.push(last);
    let mut regs = hotprobe_regs::default();
    // SAFETY: as above.
    assert_eq!(unsafe { hotprobe_ctx_regs(ctx, &mut regs) }, HOTPROBE_OK);
    // compute(x) returns x*x and set last = x.
    assert_eq!(regs.rax, last * last);
    if last == 9 {
        // The last call: `last` becomes 4242 (the program prints it) and
        // the return value 0 (the sum loses 81).
        let nv = 4242u64.to_le_bytes();
        // SAFETY: as above; `nv` is 8 readable bytes.
        let rc = unsafe { hotprobe_ctx_write(ctx, st.last_addr, nv.as_ptr().cast(), 8) };
        if rc != HOTPROBE_OK {
            st.errors.push((rc, last_error()));
        }
        regs.rax = 0;
        // SAFETY: as above.
        assert_eq!(unsafe { hotprobe_ctx_set_regs(ctx, &regs) }, HOTPROBE_OK);
    }
    // An unknown register is refused with a message, not a crash.
    // SAFETY: as above.
    let rc = unsafe { hotprobe_ctx_set_reg(ctx, 999, 1) };
    assert_eq!(rc, HOTPROBE_ERR_INVALID);
}

#[test]
fn handlers_read_and_write_registers_and_memory_stop_and_disable() {
    let dir = scratch("abi");
    let prog = compute(&dir, &["-no-pie"]);
    let out_path = dir.join("out");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut st = Box::new(State {
        last_addr: nm(&prog, "last"),
        stop_at: 4,
        ..State::default()
    });
    let user = &mut *st as *mut State as *mut c_void;

    let mut cfg = hotprobe_config {
        mechanism: 99,
        maxactive: 0,
        follow_forks: false,
        force: false,
    };
    // SAFETY: `cfg` is writable.
    unsafe { hotprobe_config_default(&mut cfg) };
    assert_eq!(cfg.mechanism, HOTPROBE_MECH_AUTO);
    assert!(cfg.maxactive > 0);
    // SAFETY: a valid config.
    let s = unsafe { hotprobe_open(&cfg) };
    assert!(!s.is_null(), "{}", last_error());

    let t = spawn_into(s, &prog, &["10"], &out);
    // SAFETY: live session.
    assert!(unsafe { hotprobe_pid(s, t) } > 0);

    // A missing function: a symbol error naming it.
    let bad = CString::new("no_such_function").unwrap();
    let mut id = u32::MAX;
    // SAFETY: live session, C string.
    let rc = unsafe { hotprobe_register_probe(s, t, bad.as_ptr(), Some(pre), None, user, &mut id) };
    assert_eq!(rc, HOTPROBE_ERR_SYMBOL);
    assert!(
        last_error().contains("no_such_function"),
        "{}",
        last_error()
    );
    assert_eq!(id, u32::MAX);
    // A NULL spec.
    // SAFETY: NULL is allowed and refused.
    let rc = unsafe { hotprobe_register_probe(s, t, null(), Some(pre), None, user, &mut id) };
    assert_eq!(rc, HOTPROBE_ERR_INVALID);
    assert_eq!(last_error(), "spec is NULL");

    let spec = CString::new("compute").unwrap();
    let (mut p, mut r) = (0u32, 0u32);
    // SAFETY: live session, C string, handlers valid for the test.
    let rc = unsafe { hotprobe_register_probe(s, t, spec.as_ptr(), Some(pre), None, user, &mut p) };
    assert_eq!(rc, HOTPROBE_OK, "{}", last_error());
    // SAFETY: as above.
    let rc = unsafe {
        hotprobe_register_retprobe(s, t, spec.as_ptr(), None, Some(ret), user, 8, &mut r)
    };
    assert_eq!(rc, HOTPROBE_OK, "{}", last_error());
    // SAFETY: live session.
    let rc = unsafe { hotprobe_stats_of(s, 0xdead, null_mut()) };
    assert_eq!(rc, HOTPROBE_ERR_NOT_FOUND);

    // The pre handler stops the loop at its 4th hit (compute(3) entered).
    // SAFETY: live session.
    let rc = unsafe { hotprobe_run(s) };
    assert_eq!(rc, HOTPROBE_END_STOPPED, "{}", last_error());
    assert_eq!(st.args, [0, 1, 2, 3]);
    assert_eq!(st.lasts, [0, 1, 2]);

    // The entry probe disabled, the run goes on to the end: its handler
    // runs no more, the return probe's still does.
    // SAFETY: live session.
    let rc = unsafe { hotprobe_disable(s, p) };
    assert_eq!(rc, HOTPROBE_OK, "{}", last_error());
    // SAFETY: live session.
    let rc = unsafe { hotprobe_run(s) };
    assert_eq!(rc, HOTPROBE_END_EXITED, "{}", last_error());
    assert_eq!(st.args, [0, 1, 2, 3], "a disabled probe's handler ran");
    assert_eq!(st.lasts, (0..10).collect::<Vec<u64>>());
    assert!(st.errors.is_empty(), "{:?}", st.errors);
    assert_eq!(
        st.too_long,
        Some((
            HOTPROBE_ERR_INVALID,
            "len 1048577: at most HOTPROBE_MAX_READ (1048576) bytes per read".to_string()
        ))
    );

    let mut ps = hotprobe_stats::default();
    let mut rs = hotprobe_stats::default();
    // SAFETY: live session, writable outs.
    unsafe {
        assert_eq!(hotprobe_stats_of(s, p, &mut ps), HOTPROBE_OK);
        assert_eq!(hotprobe_stats_of(s, r, &mut rs), HOTPROBE_OK);
    }
    assert_eq!((ps.hits, ps.nmissed), (4, 0));
    assert_eq!((rs.hits, rs.returns, rs.nmissed), (10, 10, 0));
    let mut code = -1;
    // SAFETY: live session.
    assert_eq!(unsafe { hotprobe_exit_status(s, t, &mut code) }, 1);
    assert_eq!(code, 0);
    // SAFETY: the handle is not used again.
    unsafe { hotprobe_close(s) };

    // 285 - 81 (compute(9) returned 0), and `last` as the handler wrote it.
    assert_eq!(
        std::fs::read_to_string(&out_path).unwrap(),
        "sum 204 last 4242 twice 20\n"
    );
}

#[test]
fn unregister_restores_the_code() {
    let dir = scratch("unregister");
    let prog = compute(&dir, &[]);
    let out_path = dir.join("out");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut st = Box::new(State {
        stop_at: 2,
        ..State::default()
    });
    let user = &mut *st as *mut State as *mut c_void;
    // SAFETY: NULL config: the defaults.
    let s = unsafe { hotprobe_open(null()) };
    assert!(!s.is_null());
    st.reenter = s as usize;
    let path = CString::new(prog.to_str().unwrap()).unwrap();
    let arg = CString::new("6").unwrap();
    let argv = [arg.as_ptr(), null()];
    let mut t = 0;
    let spec = CString::new("compute").unwrap();
    let mut p = 0;
    // SAFETY: live session, C strings, handlers valid for the test.
    unsafe {
        assert_eq!(
            hotprobe_spawn_io(
                s,
                path.as_ptr(),
                argv.as_ptr(),
                -1,
                out.as_raw_fd(),
                -1,
                &mut t
            ),
            HOTPROBE_OK
        );
        assert_eq!(
            hotprobe_register_probe(s, t, spec.as_ptr(), Some(pre), None, user, &mut p),
            HOTPROBE_OK
        );
        assert_eq!(hotprobe_run(s), HOTPROBE_END_STOPPED);
        assert_eq!(hotprobe_unregister(s, p), HOTPROBE_OK, "{}", last_error());
        assert_eq!(hotprobe_unregister(s, p), HOTPROBE_ERR_NOT_FOUND);
        assert_eq!(hotprobe_run(s), HOTPROBE_END_EXITED);
        hotprobe_close(s);
    }
    assert_eq!(st.args, [0, 1]);
    let refused = "the session is running: only hotprobe_ctx_* calls are allowed in a handler";
    assert_eq!(
        st.reentered,
        [
            (HOTPROBE_ERR_INVALID, refused.to_string()),
            (HOTPROBE_ERR_INVALID, refused.to_string())
        ]
    );
    assert_eq!(
        std::fs::read_to_string(&out_path).unwrap(),
        "sum 55 last 5 twice 12\n"
    );
}

#[test]
fn bad_arguments_are_codes_not_crashes() {
    let mut cfg = hotprobe_config {
        mechanism: 42,
        maxactive: 1,
        follow_forks: false,
        force: false,
    };
    // SAFETY: a valid config pointer.
    assert!(unsafe { hotprobe_open(&cfg) }.is_null());
    assert_eq!(last_error(), "unknown mechanism 42");
    cfg.mechanism = HOTPROBE_MECH_TRAP;
    cfg.maxactive = 0;
    // SAFETY: as above.
    assert!(unsafe { hotprobe_open(&cfg) }.is_null());
    // SAFETY: NULL session and context are refused.
    unsafe {
        assert_eq!(hotprobe_run(null_mut()), HOTPROBE_ERR_INVALID);
        assert_eq!(hotprobe_ctx_stop(null_mut()), HOTPROBE_ERR_INVALID);
        assert_eq!(
            hotprobe_attach(null_mut(), 1, null_mut()),
            HOTPROBE_ERR_INVALID
        );
    }
    // SAFETY: NULL config: the defaults.
    let s = unsafe { hotprobe_open(null()) };
    let missing = CString::new("/nonexistent/program").unwrap();
    let mut t = 0;
    // SAFETY: live session, C string.
    unsafe {
        assert_eq!(
            hotprobe_spawn(s, missing.as_ptr(), null(), &mut t),
            HOTPROBE_ERR_TARGET
        );
        assert!(
            last_error().contains("/nonexistent/program"),
            "{}",
            last_error()
        );
        assert_eq!(hotprobe_attach(s, -5, &mut t), HOTPROBE_ERR_INVALID);
        let stub = CString::new("nonsense").unwrap();
        let syms = CString::new("/nonexistent/System.map").unwrap();
        assert_eq!(
            hotprobe_connect_guest(s, stub.as_ptr(), syms.as_ptr(), &mut t),
            HOTPROBE_ERR_INVALID
        );
        let stub = CString::new("127.0.0.1:1").unwrap();
        assert_eq!(
            hotprobe_connect_guest(s, stub.as_ptr(), syms.as_ptr(), &mut t),
            HOTPROBE_ERR_SYMBOL
        );
        assert!(last_error().contains("System.map"), "{}", last_error());
        hotprobe_close(s);
    }
}

#[test]
fn count_places_every_match_and_counts_exactly() {
    let dir = scratch("count");
    let prog = compute(&dir, &[]);
    let out_path = dir.join("out");
    let out = std::fs::File::create(&out_path).unwrap();
    // SAFETY: NULL config: the defaults.
    let s = unsafe { hotprobe_open(null()) };
    assert!(!s.is_null());
    let spec = CString::new("[ct][ow][mi]*").unwrap();
    let t = spawn_into(s, &prog, &["25"], &out);
    let mut ids = [u32::MAX; 4];
    let mut n = 0usize;
    // SAFETY: live session, C strings, `ids` has room for 4.
    unsafe {
        let rc = hotprobe_count(s, t, spec.as_ptr(), ids.as_mut_ptr(), ids.len(), &mut n);
        assert_eq!(rc, HOTPROBE_OK, "{}", last_error());
        assert_eq!(hotprobe_run(s), HOTPROBE_END_EXITED, "{}", last_error());
    }
    // compute and twice.
    assert_eq!(n, 2);
    let mut hits = Vec::new();
    for id in &ids[..n] {
        let mut st = hotprobe_stats::default();
        // SAFETY: live session, writable out.
        let rc = unsafe { hotprobe_stats_of(s, *id, &mut st) };
        assert_eq!(rc, HOTPROBE_OK);
        hits.push(st.hits);
    }
    hits.sort();
    assert_eq!(hits, [1, 25]);
    // SAFETY: the handle is not used again.
    unsafe { hotprobe_close(s) };
    assert_eq!(
        std::fs::read_to_string(&out_path).unwrap(),
        "sum 4900 last 24 twice 50\n"
    );
}
