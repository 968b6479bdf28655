//! The trap mechanism with Kprobes semantics on real gcc-compiled programs:
//! counts equal the calls the program made, arguments and return values
//! equal what it printed, handlers that write registers change its result.

mod support;

use hotprobe::{HitContext, Probe, RetProbe, RunEnd, RuntimeAddr};
use std::cell::RefCell;
use std::rc::Rc;
use support::*;

type Shared<T> = Rc<RefCell<T>>;

fn counter() -> (Shared<u64>, impl FnMut(&mut HitContext<'_>) + 'static) {
    let c = Rc::new(RefCell::new(0u64));
    let c2 = c.clone();
    (c, move |_ctx: &mut HitContext<'_>| *c2.borrow_mut() += 1)
}

/// Run to the end and return the program's output.
fn finish(t: &mut Captured) -> String {
    t.session.start().unwrap();
    assert_eq!(t.session.run().unwrap(), RunEnd::AllExited);
    t.output()
}

/// Address and plan of the first instruction of `func` matching `pred`.
fn find_insn(
    t: &mut Captured,
    func: &str,
    pred: impl Fn(&hotprobe_x86::iced_x86::Instruction) -> bool,
) -> RuntimeAddr {
    let r = t.session.resolve(t.target, func).unwrap().remove(0);
    let range = r.function_range.clone().unwrap();
    let mut code = vec![0u8; (range.end.0 - range.start.0) as usize];
    t.session
        .engine(t.target)
        .unwrap()
        .target()
        .read_memory(range.start, &mut code)
        .unwrap();
    for start in hotprobe_x86::instruction_starts(&code, range.start.0) {
        let off = (start - range.start.0) as usize;
        let insn = hotprobe_x86::decode(&code[off..], start).unwrap();
        if pred(&insn) {
            return RuntimeAddr(start);
        }
    }
    panic!("no matching instruction in {func}");
}

#[test]
fn counts_a_function_in_a_pie_o2_binary() {
    let bin = program("target", &["-O2", "-pie", "-fPIE"]);
    let mut t = spawn(&bin, &["compute", "100"]);
    let (seen, f) = counter();
    let id = t
        .session
        .probe(t.target, "compute", Probe::new().pre(f))
        .unwrap();
    assert_eq!(
        t.session.execution_of(id),
        Some("boosted"),
        "the entry of compute is boosted"
    );
    let out = finish(&mut t);
    assert_eq!(lines_with(&out, "compute(").len(), 100, "{out}");
    assert_eq!(*seen.borrow(), 100);
    assert_eq!(t.session.stats(id).unwrap().hits, 100);
}

#[test]
fn counts_a_function_in_a_non_pie_o0_binary() {
    let bin = program("target", &["-O0", "-no-pie", "-fno-pie"]);
    let mut t = spawn(&bin, &["compute", "37", "caller", "5"]);
    let id = t.session.probe(t.target, "compute", Probe::new()).unwrap();
    let out = finish(&mut t);
    // compute runs 37 times directly and 5 times through caller.
    assert_eq!(
        lines_with(&out, "compute(").len() + lines_with(&out, "caller(").len(),
        42
    );
    assert_eq!(t.session.stats(id).unwrap().hits, 42);
}

#[test]
fn counts_a_libc_function() {
    let bin = program("target", &["-O2"]);
    let mut t = spawn(&bin, &["getpid", "250"]);
    let id = t
        .session
        .probe(t.target, "libc:getpid", Probe::new())
        .unwrap();
    let out = finish(&mut t);
    assert!(out.contains("getpid x250 sum"), "{out}");
    assert_eq!(t.session.stats(id).unwrap().hits, 250);
}

#[test]
fn counts_mid_function_rip_relative_and_call_instructions() {
    let bin = program("target", &["-O2"]);
    let mut t = spawn(&bin, &["caller", "60"]);
    // compute's `global_counter++` reads and writes memory RIP-relatively.
    let riprel = find_insn(&mut t, "compute", |i| i.is_ip_rel_memory_operand());
    // caller's `call compute`.
    let call = find_insn(&mut t, "caller", |i| i.is_call_near());
    // an instruction in the middle of caller, after the call.
    let mid = {
        let r = t.session.resolve(t.target, "caller").unwrap().remove(0);
        assert!(
            call.0 > r.addr.0,
            "the call is not caller's first instruction"
        );
        let mut code = [0u8; 16];
        t.session
            .engine(t.target)
            .unwrap()
            .target()
            .read_memory(call, &mut code)
            .unwrap();
        RuntimeAddr(call.0 + hotprobe_x86::decode(&code, call.0).unwrap().len() as u64)
    };
    let spec = |a: RuntimeAddr| format!("{:#x}", a.0);
    let r = t.session.resolve(t.target, &spec(riprel)).unwrap();
    assert_eq!(r[0].function.as_deref(), Some("compute"));
    let id_rip = t
        .session
        .probe(t.target, &spec(riprel), Probe::new())
        .unwrap();
    let id_call = t
        .session
        .probe(t.target, &spec(call), Probe::new())
        .unwrap();
    let id_mid = t.session.probe(t.target, &spec(mid), Probe::new()).unwrap();
    assert_eq!(
        t.session.execution_of(id_rip),
        Some("boosted"),
        "RIP-relative operand relocated and boosted"
    );
    assert_eq!(t.session.execution_of(id_call), Some("emulated"));
    let out = finish(&mut t);
    // The program's own account is unchanged: the relocated increment hit the real counter.
    assert!(out.contains("done caller 60 counter 60"), "{out}");
    for (i, line) in lines_with(&out, "caller(").iter().enumerate() {
        assert_eq!(*line, format!("caller({i}) = {}", i * 3 + 1 + 1));
    }
    for id in [id_rip, id_call, id_mid] {
        assert_eq!(t.session.stats(id).unwrap().hits, 60);
    }
}

#[test]
fn post_handlers_single_step_and_see_the_result() {
    let bin = program("target", &["-O2"]);
    let mut t = spawn(&bin, &["caller", "20"]);
    let riprel = find_insn(&mut t, "compute", |i| i.is_ip_rel_memory_operand());
    // Post handler reads global_counter after the increment executed.
    let counter_addr = {
        let mut code = [0u8; 16];
        t.session
            .engine(t.target)
            .unwrap()
            .target()
            .read_memory(riprel, &mut code)
            .unwrap();
        hotprobe_x86::decode(&code, riprel.0)
            .unwrap()
            .ip_rel_memory_address()
    };
    let seen: Shared<Vec<(u64, u64)>> = Rc::default();
    let (s1, s2) = (seen.clone(), seen.clone());
    let id = t
        .session
        .probe(
            t.target,
            &format!("{:#x}", riprel.0),
            Probe::new()
                .pre(move |ctx| {
                    let v = ctx.read_u64(counter_addr).unwrap();
                    s1.borrow_mut().push((v, u64::MAX));
                })
                .post(move |ctx| {
                    let v = ctx.read_u64(counter_addr).unwrap();
                    s2.borrow_mut().last_mut().unwrap().1 = v;
                }),
        )
        .unwrap();
    assert_eq!(t.session.execution_of(id), Some("boosted"));
    let out = finish(&mut t);
    assert!(out.contains("done caller 20 counter 20"), "{out}");
    let seen = seen.borrow();
    assert_eq!(seen.len(), 20);
    for (i, (before, after)) in seen.iter().enumerate() {
        assert_eq!(
            (*before, *after),
            (i as u64, i as u64 + 1),
            "post ran after the increment"
        );
    }
}

#[test]
fn several_probes_on_one_address_and_run_time_enable() {
    let bin = program("target", &["-O2"]);
    let mut t = spawn(&bin, &["compute", "10"]);
    let (a, fa) = counter();
    let (b, fb) = counter();
    let (c, fc) = counter();
    let ida = t
        .session
        .probe(t.target, "compute", Probe::new().pre(fa))
        .unwrap();
    let idb = t
        .session
        .probe(t.target, "compute", Probe::new().pre(fb))
        .unwrap();
    let idc = t
        .session
        .probe(t.target, "compute", Probe::new().post(fc))
        .unwrap();
    t.session.set_enabled(idb, false).unwrap();
    let out = finish(&mut t);
    assert_eq!(lines_with(&out, "compute(").len(), 10);
    assert_eq!((*a.borrow(), *b.borrow(), *c.borrow()), (10, 0, 10));
    assert_eq!(t.session.stats(ida).unwrap().hits, 10);
    assert_eq!(t.session.stats(idc).unwrap().hits, 10);
}

#[test]
fn arguments_and_return_values_match_the_program() {
    let bin = program("target", &["-O2"]);
    let mut t = spawn(&bin, &["compute", "25"]);
    let calls: Shared<Vec<(u64, u64, u64)>> = Rc::default();
    let c = calls.clone();
    let id = t
        .session
        .retprobe(
            t.target,
            "compute",
            RetProbe::new(4).ret(move |ctx| {
                c.borrow_mut()
                    .push((ctx.arg(0).unwrap(), ctx.arg(1).unwrap(), ctx.return_value()));
            }),
        )
        .unwrap();
    let out = finish(&mut t);
    let printed: Vec<(u64, u64, u64)> = lines_with(&out, "compute(")
        .iter()
        .map(|l| {
            let (lhs, r) = l.split_once(" = ").unwrap();
            let args = lhs.trim_start_matches("compute(").trim_end_matches(')');
            let (x, y) = args.split_once(", ").unwrap();
            (x.parse().unwrap(), y.parse().unwrap(), r.parse().unwrap())
        })
        .collect();
    assert_eq!(printed.len(), 25);
    assert_eq!(*calls.borrow(), printed);
    let st = t.session.stats(id).unwrap();
    assert_eq!((st.hits, st.returns, st.nmissed), (25, 25, 0));
}

#[test]
fn a_handler_that_writes_a_register_changes_the_result() {
    let bin = program("target", &["-O2"]);
    let mut t = spawn(&bin, &["compute", "3"]);
    t.session
        .retprobe(
            t.target,
            "compute",
            RetProbe::new(1).ret(|ctx| ctx.regs_mut().rax = 4242),
        )
        .unwrap();
    // And a pre handler on caller-less compute args: force arg b to 100 on entry.
    t.session
        .probe(
            t.target,
            "compute",
            Probe::new().pre(|ctx| ctx.regs_mut().rsi = 100),
        )
        .unwrap();
    let out = finish(&mut t);
    assert_eq!(
        lines_with(&out, "compute("),
        vec![
            "compute(0, 7) = 4242",
            "compute(1, 7) = 4242",
            "compute(2, 7) = 4242"
        ]
    );
    // The changed argument reached the function: global state is what the
    // program computed with b = 100 (the return value was replaced).
}

#[test]
fn a_pre_handler_that_moves_rip_skips_the_function() {
    let bin = program("target", &["-O2"]);
    let mut t = spawn(&bin, &["compute", "4"]);
    // Emulate `return 7` at entry: pop the return address into rip.
    t.session
        .probe(
            t.target,
            "compute",
            Probe::new().pre(|ctx| {
                let rsp = ctx.regs().rsp;
                let ret = ctx.read_u64(rsp).unwrap();
                let r = ctx.regs_mut();
                r.rip = ret;
                r.rsp = rsp + 8;
                r.rax = 7;
            }),
        )
        .unwrap();
    let out = finish(&mut t);
    assert_eq!(lines_with(&out, "compute(").len(), 4);
    assert!(
        lines_with(&out, "compute(")
            .iter()
            .all(|l| l.ends_with("= 7")),
        "{out}"
    );
    // compute's body never ran: its counter stayed 0.
    assert!(out.contains("done compute 4 counter 0"), "{out}");
}

#[test]
fn eight_threads_give_an_exact_total() {
    let bin = program("threads", &["-O2"]);
    let mut t = spawn(&bin, &["2000"]);
    let (seen, f) = counter();
    let id = t
        .session
        .probe(t.target, "work", Probe::new().pre(f))
        .unwrap();
    let out = finish(&mut t);
    assert!(out.contains("threads 8 iters 2000 calls 16000"), "{out}");
    assert_eq!(*seen.borrow(), 16000);
    assert_eq!(t.session.stats(id).unwrap().hits, 16000);
}

#[test]
fn eight_threads_with_single_stepped_probes() {
    let bin = program("threads", &["-O2"]);
    let mut t = spawn(&bin, &["500"]);
    let (post, f) = counter();
    let id = t
        .session
        .probe(t.target, "work", Probe::new().post(f))
        .unwrap();
    let out = finish(&mut t);
    assert!(out.contains("calls 4000"), "{out}");
    assert_eq!(*post.borrow(), 4000);
    assert_eq!(t.session.stats(id).unwrap().hits, 4000);
}

#[test]
fn return_probes_on_recursion_respect_maxactive() {
    let bin = program("target", &["-O2"]);
    // rec(49) makes 50 calls, nested 50 deep.
    let mut t = spawn(&bin, &["rec", "49"]);
    let (rets, f) = counter();
    let (entries, g) = counter();
    let id = t
        .session
        .retprobe(t.target, "rec", RetProbe::new(10).entry(g).ret(f))
        .unwrap();
    let out = finish(&mut t);
    assert!(out.contains("rec(49) = 49"), "{out}");
    let st = t.session.stats(id).unwrap();
    assert_eq!(st.hits, 50);
    assert_eq!(*rets.borrow(), 10);
    assert_eq!(*entries.borrow(), 10);
    assert_eq!(st.returns + st.nmissed, 50, "{st:?}");
    assert_eq!(st.nmissed, 40);
}

#[test]
fn return_values_through_recursion_nest_properly() {
    let bin = program("target", &["-O0"]);
    let mut t = spawn(&bin, &["rec", "5"]);
    let seen: Shared<Vec<(u64, u64, usize)>> = Rc::default();
    let s = seen.clone();
    t.session
        .retprobe(
            t.target,
            "rec",
            RetProbe::new(64).ret(move |ctx| {
                let depth = ctx.entry().unwrap().depth;
                s.borrow_mut()
                    .push((ctx.arg(0).unwrap(), ctx.return_value(), depth));
            }),
        )
        .unwrap();
    let out = finish(&mut t);
    assert!(out.contains("rec(5) = 5"));
    // Innermost returns first: rec(n) returns n, at depth 5 - n.
    let want: Vec<(u64, u64, usize)> = (0..=5).map(|n| (n, n, 5 - n as usize)).collect();
    assert_eq!(*seen.borrow(), want);
}

#[test]
fn a_handler_can_stop_the_loop_and_detach_leaves_the_program_running() {
    let bin = program("target", &["-O2"]);
    let mut t = spawn(&bin, &["compute", "50"]);
    let n = Rc::new(RefCell::new(0));
    let n2 = n.clone();
    t.session
        .probe(
            t.target,
            "compute",
            Probe::new().pre(move |ctx| {
                *n2.borrow_mut() += 1;
                if *n2.borrow() == 10 {
                    ctx.stop();
                }
            }),
        )
        .unwrap();
    t.session.start().unwrap();
    assert_eq!(t.session.run().unwrap(), RunEnd::Stopped);
    assert_eq!(*n.borrow(), 10);
    t.session.detach().unwrap();
    // The program runs on untraced and finishes all 50 calls.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !t.output().contains("done compute 50") {
        assert!(
            std::time::Instant::now() < deadline,
            "program did not finish: {}",
            t.output()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(lines_with(&t.output(), "compute(").len(), 50);
}

#[test]
fn a_forked_child_exits_normally() {
    let bin = program("forker", &["-O2"]);
    let mut t = spawn(&bin, &[]);
    let rp = t
        .session
        .retprobe(t.target, "child_work", RetProbe::new(8))
        .unwrap();
    let id = t
        .session
        .probe(t.target, "child_work", Probe::new())
        .unwrap();
    let out = finish(&mut t);
    assert!(out.contains("child sum 20"), "{out}");
    assert!(out.contains("child exited 0"), "{out}");
    // Only the parent's 3 calls are seen: the child was released without probes.
    assert_eq!(t.session.stats(id).unwrap().hits, 3);
    assert_eq!(t.session.stats(rp).unwrap().returns, 3);
}

#[test]
fn signals_pass_through_untouched_while_probes_step() {
    let bin = program("signals", &["-O2"]);
    let mut t = spawn(&bin, &["5000"]);
    // A stepped probe (post handler) and a boosted one on the same function.
    let (post, f) = counter();
    let id = t
        .session
        .probe(t.target, "tick", Probe::new().post(f))
        .unwrap();
    let out = finish(&mut t);
    // 5000 calls in the loop, 5 from each of the two signal handlers.
    assert_eq!(out.trim(), "calls 5000 usr1 5 rt 5 ticks 5010 alarms>0 1");
    assert_eq!(*post.borrow(), 5010);
    assert_eq!(t.session.stats(id).unwrap().hits, 5010);
}
