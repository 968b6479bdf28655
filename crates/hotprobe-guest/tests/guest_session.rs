//! The engine's probes on guest kernels through `Session`: the same Probe /
//! RetProbe / handlers as for processes, on a real Debian kernel booted twice
//! under QEMU TCG (two guests in one session). One test function, so the two
//! boots serve every assertion.

#[path = "guest/harness.rs"]
mod harness;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::Guest;
use hotprobe::{Probe, RetProbe, RunEnd, Session, TargetId};
use hotprobe_guest::{load_symbols, mem, open_guest, GuestConfig, RamFile, StubAddr};
use hotprobe_target::{GuestVirt, RuntimeAddr};
use hotprobe_x86::Execution;

const LONG: Duration = Duration::from_secs(120);

/// Handles events for about `d`: through `Session::run_until` (which polls
/// every live target in turn) when several guests live; with one, the
/// session would block until its next event, so its engine is polled.
fn pump(s: &mut Session, targets: &[TargetId], wake: &AtomicBool, d: Duration) {
    let live: Vec<TargetId> = targets
        .iter()
        .copied()
        .filter(|t| s.engine(*t).unwrap().gone().is_none())
        .collect();
    if live.len() > 1 {
        wake.store(false, Ordering::SeqCst);
        match s.run_until(wake).expect("session healthy") {
            RunEnd::Interrupted => {}
            other => panic!("run ended early: {other:?}"),
        }
        return;
    }
    let t0 = Instant::now();
    while t0.elapsed() < d {
        for t in &live {
            let _ = s
                .engine(*t)
                .unwrap()
                .poll(Some(Duration::from_millis(10)))
                .expect("healthy");
        }
    }
}

/// Runs the session until every marker has appeared on its guest's console
/// (all-stop: a hit is handled before the guest can go on, so once the
/// workload printed its marker every hit it made has been counted).
fn run_until_markers(s: &mut Session, targets: &[TargetId], waits: &mut [(&mut Guest, String)]) {
    let wake = Arc::new(AtomicBool::new(false));
    let w2 = wake.clone();
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let ticker = std::thread::spawn(move || {
        while !d2.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50));
            w2.store(true, Ordering::SeqCst);
        }
    });
    let deadline = Instant::now() + LONG;
    let mut seen = vec![false; waits.len()];
    while seen.iter().any(|x| !x) {
        assert!(Instant::now() < deadline, "markers never came: {seen:?}");
        pump(s, targets, &wake, Duration::from_millis(50));
        for (i, (g, m)) in waits.iter_mut().enumerate() {
            if !seen[i] && g.seen(m) {
                seen[i] = true;
            }
        }
    }
    done.store(true, Ordering::SeqCst);
    ticker.join().unwrap();
}

fn counter() -> (Rc<RefCell<u64>>, impl FnMut(&mut hotprobe::HitContext<'_>)) {
    let c = Rc::new(RefCell::new(0u64));
    let c2 = c.clone();
    (c, move |_: &mut hotprobe::HitContext<'_>| {
        *c2.borrow_mut() += 1
    })
}

fn connect(s: &mut Session, g: &Guest, direct_ram: bool) -> TargetId {
    let (syms, text) = load_symbols(&g.kallsyms_file()).unwrap();
    assert!(text.is_some(), "_stext/_etext in the guest's kallsyms");
    let mut cfg = GuestConfig::new(StubAddr::Unix(g.gdb_socket.clone()));
    if direct_ram {
        cfg.ram_file = Some(g.ram_file.clone());
    }
    let (target, resolver) = open_guest(cfg, syms).unwrap();
    let id = s.add_target(Box::new(target), Some(Box::new(resolver)));
    s.engine(id).unwrap().set_step_unsupported_in_place(true);
    id
}

/// The offset of the first instruction of `func` that the engine boosts
/// (the entry is an ftrace NOP, emulated).
fn first_boosted_offset(s: &mut Session, t: TargetId, func: u64) -> u64 {
    let mut code = [0u8; 96];
    s.engine(t)
        .unwrap()
        .target()
        .read_memory(RuntimeAddr(func), &mut code)
        .unwrap();
    let mut off = 0usize;
    while off + 16 <= code.len() {
        let plan = hotprobe_x86::plan_probe(&code[off..], func + off as u64, func + off as u64)
            .expect("plannable");
        if plan.execution == Execution::Boost {
            return off as u64;
        }
        off += plan.len;
    }
    panic!("no boostable instruction in the first bytes of the function");
}

#[test]
fn session_probes_on_guest_kernels() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("\n!!!!!!!! SKIPPED session_probes_on_guest_kernels: {why} !!!!!!!!\n");
        return;
    }
    // Two guests, booted side by side.
    let hb = std::thread::spawn(|| Guest::boot("sess-b"));
    let mut ga = Guest::boot("sess-a");
    let mut gb = hb.join().unwrap();
    eprintln!("booted: A {:?}, B {:?}", ga.boot_time, gb.boot_time);
    let getppid = ga.sym("__x64_sys_getppid");
    let (stext, etext) = (ga.sym("_stext"), ga.sym("_etext"));

    let mut s = Session::new();
    let a = connect(&mut s, &ga, true);
    let b = connect(&mut s, &gb, false);

    // Guest A's kernel text before any probe, read from its RAM file.
    let cr3 = {
        let t = s.engine(a).unwrap().target();
        let th = t.threads()[0];
        t.registers(th).unwrap().cr3
    };
    let read_text = |g: &Guest| {
        let mut ram = RamFile::open(&g.ram_file).unwrap();
        let mut v = vec![0u8; ((etext + 4095) & !4095) as usize - stext as usize];
        mem::read_virt(&mut ram, cr3, 0, GuestVirt(stext), &mut v).unwrap();
        v
    };
    let text_before = read_text(&ga);

    // --- refusals: blacklist, instruction boundary ---
    let e = s.probe(a, "entry_SYSCALL_64", Probe::new()).unwrap_err();
    assert!(e.to_string().contains("blacklisted"), "{e}");
    let e = s
        .probe(a, "__x64_sys_getppid+0x1", Probe::new())
        .unwrap_err();
    assert!(e.to_string().contains("middle of an instruction"), "{e}");
    assert!(s.probe(a, "no_such_function_xyz", Probe::new()).is_err());

    // --- getppid: entry (emulated NOP) + an instruction stepped for its post handler ---
    let off = first_boosted_offset(&mut s, a, getppid);
    let inner = format!("__x64_sys_getppid+{off:#x}");
    let (entry_n, entry_f) = counter();
    let p_entry = s
        .probe(a, "__x64_sys_getppid", Probe::new().pre(entry_f))
        .unwrap();
    let (post_n, post_f) = counter();
    let (pre_n, pre_f) = counter();
    let p_step = s
        .probe(a, &inner, Probe::new().pre(pre_f).post(post_f))
        .unwrap();
    assert_eq!(s.execution_of(p_entry), Some("emulated"));
    // A boostable site; its post handler makes the engine single-step the
    // slot instead (post handlers run only after that step).
    assert_eq!(s.execution_of(p_step), Some("boosted"));
    s.start().unwrap();
    let n = 40;
    ga.send_line(&format!("getppid {n}"));
    let t0 = Instant::now();
    run_until_markers(
        &mut s,
        &[a, b],
        &mut [(&mut ga, format!("@getppid {n} done"))],
    );
    let stepped_ms = t0.elapsed().as_secs_f64() * 1e3 / n as f64;
    assert_eq!(*entry_n.borrow(), n, "entry probe: every getppid once");
    assert_eq!(*pre_n.borrow(), n, "stepped probe: pre once per call");
    assert_eq!(*post_n.borrow(), n, "stepped probe: post once per call");
    assert_eq!(s.stats(p_step).unwrap().hits, n);
    eprintln!("FIGURE session, entry (emulated) + {inner} (stepped): {stepped_ms:.2} ms per call");

    // --- the same instruction boosted (no post handler) ---
    s.remove_probe(p_step).unwrap();
    let (boost_n, boost_f) = counter();
    let p_boost = s.probe(a, &inner, Probe::new().pre(boost_f)).unwrap();
    assert_eq!(s.execution_of(p_boost), Some("boosted"));
    ga.send_line(&format!("getppid {n}"));
    let t0 = Instant::now();
    run_until_markers(
        &mut s,
        &[a, b],
        &mut [(&mut ga, format!("@getppid {n} done"))],
    );
    let boosted_ms = t0.elapsed().as_secs_f64() * 1e3 / n as f64;
    assert_eq!(*boost_n.borrow(), n, "boosted probe: every getppid once");
    assert_eq!(*entry_n.borrow(), 2 * n);
    eprintln!("FIGURE session, entry (emulated) + {inner} (boosted): {boosted_ms:.2} ms per call");
    s.remove_probe(p_boost).unwrap();

    // --- openat: file name through pt_regs; return value by a return probe ---
    let names = Rc::new(RefCell::new(Vec::<String>::new()));
    let n2 = names.clone();
    let p_open = s
        .probe(
            a,
            "__x64_sys_openat",
            Probe::new().pre(move |ctx| {
                // __x64_sys_openat(const struct pt_regs *regs): filename = regs->si
                let si = ctx.read_u64(ctx.regs().rdi + 13 * 8).unwrap();
                n2.borrow_mut().push(ctx.read_cstr(si, 256).unwrap());
            }),
        )
        .unwrap();
    let rets = Rc::new(RefCell::new(Vec::<(String, i64)>::new()));
    let r2 = rets.clone();
    let p_ret = s
        .retprobe(
            a,
            "__x64_sys_openat%return",
            RetProbe::new(8).ret(move |ctx| {
                let regs = ctx.entry().unwrap().regs;
                let si = ctx.read_u64(regs.rdi + 13 * 8).unwrap();
                let name = ctx.read_cstr(si, 256).unwrap();
                r2.borrow_mut().push((name, ctx.return_value() as i64));
            }),
        )
        .unwrap();
    let mut printed = Vec::new();
    for path in ["/tmp/probe-me.txt", "/tmp/no-such-file"] {
        ga.send_line(&format!("open {path}"));
        let marker = format!("@open {path} fd=");
        run_until_markers(&mut s, &[a, b], &mut [(&mut ga, marker)]);
        let line = ga.wait_for("\n", Duration::from_secs(5));
        let fd: i64 = String::from_utf8_lossy(&line).trim().parse().unwrap();
        printed.push((path.to_string(), fd));
    }
    eprintln!(
        "openat names seen: {:?}; returns: {:?}",
        names.borrow(),
        rets.borrow()
    );
    for (path, fd) in &printed {
        assert!(
            names.borrow().iter().any(|n| n == path),
            "the pre handler read {path} from guest user memory"
        );
        let got: Vec<i64> = rets
            .borrow()
            .iter()
            .filter(|(n, _)| n == path)
            .map(|(_, r)| *r)
            .collect();
        assert_eq!(
            got,
            vec![*fd],
            "the return probe saw what the workload printed for {path}"
        );
    }
    assert_eq!(printed[1].1, -2, "a missing file gives -ENOENT");
    s.remove_probe(p_open).unwrap();
    s.remove_probe(p_ret).unwrap();

    // --- two guests at once: each count right ---
    let (b_n, b_f) = counter();
    let pb = s
        .probe(b, "__x64_sys_getppid", Probe::new().pre(b_f))
        .unwrap();
    let (b_boost_n, b_boost_f) = counter();
    let pb2 = s.probe(b, &inner, Probe::new().pre(b_boost_f)).unwrap();
    assert_eq!(
        s.execution_of(pb2),
        Some("boosted"),
        "OEA found through the stub too"
    );
    s.start().unwrap();
    ga.send_line("getppid 30");
    gb.send_line("getppid 25");
    run_until_markers(
        &mut s,
        &[a, b],
        &mut [
            (&mut ga, "@getppid 30 done".to_string()),
            (&mut gb, "@getppid 25 done".to_string()),
        ],
    );
    assert_eq!(*entry_n.borrow(), 2 * n + 30, "guest A counted alone");
    assert_eq!(*b_n.borrow(), 25, "guest B counted alone");
    assert_eq!(*b_boost_n.borrow(), 25);
    assert_eq!(s.stats(pb).unwrap().hits, 25);

    // --- guest B dies mid-run: A stays probed, the session goes on ---
    gb.send_line("getppid 100000000");
    ga.send_line("getppid 20");
    let killer_deadline = Instant::now() + Duration::from_millis(1500);
    // Let both run (B hitting its probes) for a while, then kill B's QEMU.
    {
        let wake = AtomicBool::new(false);
        while Instant::now() < killer_deadline {
            std::thread::scope(|sc| {
                sc.spawn(|| {
                    std::thread::sleep(Duration::from_millis(100));
                    wake.store(true, Ordering::SeqCst);
                });
                pump(&mut s, &[a, b], &wake, Duration::from_millis(100));
            });
        }
    }
    let b_before_kill = *b_n.borrow();
    assert!(b_before_kill > 25, "guest B was being probed when it died");
    gb.kill();
    // B's engine learns of the death on its next poll (Session::run_until,
    // left with one live target, would then block on A alone).
    let t0 = Instant::now();
    while s.engine(b).unwrap().gone().is_none() {
        assert!(t0.elapsed() < LONG, "B's death never noticed");
        let _ = s.engine(b).unwrap().poll(Some(Duration::from_millis(100)));
    }
    run_until_markers(
        &mut s,
        &[a, b],
        &mut [(&mut ga, "@getppid 20 done".to_string())],
    );
    assert_eq!(*entry_n.borrow(), 2 * n + 50, "guest A exact while B died");
    let notices = s.take_notices();
    eprintln!("notices: {notices:?}");
    assert!(
        notices
            .iter()
            .any(|m| m.contains(&gb.gdb_socket.display().to_string()) && m.contains("dropped")),
        "the session says guest B's probes were dropped: {notices:?}"
    );
    assert!(s.stats(pb).is_some());
    assert!(
        s.probe(b, "__x64_sys_getppid", Probe::new()).is_err(),
        "no probe on a dead guest"
    );
    ga.send_line("getppid 10");
    run_until_markers(
        &mut s,
        &[a, b],
        &mut [(&mut ga, "@getppid 10 done".to_string())],
    );
    assert_eq!(
        *entry_n.borrow(),
        2 * n + 60,
        "session healthy after B's death"
    );

    // --- detach: A runs on, its kernel text as before ---
    s.detach().unwrap();
    ga.send_line("getppid 5");
    ga.wait_for("@getppid 5 done", LONG);
    let text_after = read_text(&ga);
    // The kernel patches its own jump-label sites (static keys turned on
    // or off while the workload ran: 2- or 5-byte jmp/nop swaps); those
    // bytes are the kernel's, every other one must be as before.
    let jump_labels = {
        let (start, stop) = (
            ga.sym("__start___jump_table"),
            ga.sym("__stop___jump_table"),
        );
        let mut ram = RamFile::open(&ga.ram_file).unwrap();
        let mut table = vec![0u8; (stop - start) as usize];
        mem::read_virt(&mut ram, cr3, 0, GuestVirt(start), &mut table).unwrap();
        // struct jump_entry { s32 code; s32 target; long key; }, offsets
        // relative to the field's own address.
        let mut sites: Vec<u64> = table
            .chunks_exact(16)
            .enumerate()
            .map(|(i, e)| {
                let code = i32::from_le_bytes(e[..4].try_into().unwrap());
                (start + 16 * i as u64).wrapping_add(code as i64 as u64)
            })
            .collect();
        sites.sort_unstable();
        sites
    };
    assert!(jump_labels.len() > 100, "{} jump labels", jump_labels.len());
    // Each is a jump or a nop: the table was read right.
    for &site in jump_labels.iter().filter(|&&a| a >= stext && a < etext) {
        let b = &text_before[(site - stext) as usize..];
        assert!(
            matches!(
                b,
                [0xe9 | 0xeb, ..] | [0x0f, 0x1f, 0x44, 0, 0, ..] | [0x66, 0x90, ..]
            ),
            "jump label at {site:#x}: {:02x?}",
            &b[..5]
        );
    }
    let in_jump_label = |a: u64| {
        let i = jump_labels.partition_point(|&s| s <= a);
        i > 0 && a < jump_labels[i - 1] + 5
    };
    let diff: Vec<u64> = text_before
        .iter()
        .zip(&text_after)
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .map(|(i, _)| stext + i as u64)
        .filter(|&a| !in_jump_label(a))
        .take(16)
        .collect();
    assert!(
        diff.is_empty(),
        "kernel text (and the out-of-line area after _etext) as before detach, jump labels aside; differs at {diff:x?}"
    );
    // The stub is free again: a new client connects.
    let mut s2 = Session::new();
    let a2 = connect(&mut s2, &ga, true);
    s2.start().unwrap();
    s2.detach().unwrap();
    let _ = a2;
}
