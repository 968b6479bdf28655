//! End-to-end tests against a real Debian kernel booted under QEMU TCG.
//! One boot serves every assertion (a boot costs ≈ 6–15 s on this machine).

#[path = "guest/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use harness::Guest;
use hotprobe_guest::{mem, GuestConfig, GuestTarget, RamFile, StubAddr};
use hotprobe_target::{
    ExitStatus, GuestVirt, ResumeMode, RuntimeAddr, Target, TargetEvent, ThreadId,
};

const LONG: Duration = Duration::from_secs(120);

/// Drives the target until `done` appears on the console, answering every
/// breakpoint with `on_hit` (which resumes the thread); returns the hits.
fn run_until(
    guest: &mut Guest,
    t: &mut GuestTarget,
    done: &str,
    mut on_hit: impl FnMut(&mut GuestTarget, ThreadId, RuntimeAddr, hotprobe_target::Registers),
) -> u64 {
    let deadline = Instant::now() + LONG;
    let mut hits = 0;
    loop {
        assert!(Instant::now() < deadline, "{done:?} never came");
        match t.wait(Some(Duration::from_millis(100))).unwrap() {
            TargetEvent::Breakpoint { thread, addr, regs } => {
                assert_eq!(
                    regs.rip, addr.0,
                    "rip at a breakpoint hit is the breakpoint"
                );
                hits += 1;
                on_hit(t, thread, addr, regs);
            }
            TargetEvent::Timeout => {
                if guest.seen(done) {
                    return hits;
                }
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
}

#[test]
fn guest_kernel_probing_end_to_end() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("\n!!!!!!!! SKIPPED guest_kernel_probing_end_to_end: {why} !!!!!!!!\n");
        return;
    }
    let mut guest = Guest::boot("e2e");
    eprintln!("guest booted to READY in {:?}", guest.boot_time);
    let getppid = guest.sym("__x64_sys_getppid");
    let openat = guest.sym("__x64_sys_openat");
    let (stext, etext) = (guest.sym("_stext"), guest.sym("_etext"));

    let mut cfg = GuestConfig::new(StubAddr::Unix(guest.gdb_socket.clone()));
    cfg.ram_file = Some(guest.ram_file.clone());
    cfg.kernel_text = Some((stext, etext));
    let mut t = GuestTarget::connect(cfg).unwrap();
    let vcpus = t.threads();
    assert!(!vcpus.is_empty());
    let cpu0 = vcpus[0];
    let regs = t.registers(cpu0).unwrap();
    assert_ne!(regs.cr3, 0, "cr3 read from the g block");
    assert!(
        t.client().ack_mode(),
        "QEMU 10 has no no-ack mode (if this changed, fine: update)"
    );

    // --- memory: stub vs direct map, same bytes; timings ---
    let mut via_stub = [0u8; 64];
    let mut via_map = [0u8; 64];
    t.read_memory_stub(GuestVirt(getppid), &mut via_stub)
        .unwrap();
    t.read_memory_direct(GuestVirt(getppid), &mut via_map)
        .unwrap();
    assert_eq!(
        via_stub, via_map,
        "stub m and host page walk read the same kernel text"
    );
    let n = 200;
    let t0 = Instant::now();
    for _ in 0..n {
        t.read_memory_stub(GuestVirt(getppid), &mut via_stub)
            .unwrap();
    }
    let stub_us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    let t0 = Instant::now();
    for _ in 0..n {
        t.read_memory_direct(GuestVirt(getppid), &mut via_map)
            .unwrap();
    }
    let map_us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    eprintln!("FIGURE read 64 B of kernel text: stub m {stub_us:.1} us, host map + page walk {map_us:.2} us");
    let text_before: Vec<(u64, Vec<u8>)> = [getppid, openat]
        .iter()
        .map(|&a| {
            let mut b = vec![0u8; 64];
            t.read_memory(RuntimeAddr(a), &mut b).unwrap();
            (a, b)
        })
        .collect();
    let walk = t.translate(GuestVirt(getppid)).unwrap();
    assert!(
        walk.executable && !walk.writable,
        "kernel text is mapped RX: {walk:?}"
    );

    // --- baseline: the same calls without a probe ---
    let calls: u64 = std::env::var("HOTPROBE_GUEST_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    t.resume_all().unwrap();
    let t0 = Instant::now();
    guest.send_line(&format!("getppid {calls}"));
    guest.wait_for(&format!("@getppid {calls} done"), LONG);
    let base_ms = t0.elapsed().as_secs_f64() * 1e3;
    eprintln!(
        "FIGURE {calls} getppid calls without probe, console round trip included: {base_ms:.2} ms"
    );
    t.stop_all().unwrap();

    // --- stepped probe: count == calls, exactly ---
    let flushes0 = guest.tb_flushes();
    t.insert_breakpoint(RuntimeAddr(getppid)).unwrap();
    let mut after = [0u8; 64];
    t.read_memory(RuntimeAddr(getppid), &mut after).unwrap();
    assert_eq!(
        after.to_vec(),
        text_before[0].1,
        "Z0 leaves guest memory untouched under TCG"
    );
    t.resume_all().unwrap();
    guest.send_line(&format!("getppid {calls}"));
    let t0 = Instant::now();
    let hits = run_until(
        &mut guest,
        &mut t,
        &format!("@getppid {calls} done"),
        |t, th, addr, _| {
            assert_eq!(addr.0, getppid);
            t.resume(th, ResumeMode::Continue).unwrap();
        },
    );
    let stepped_ms = t0.elapsed().as_secs_f64() * 1e3 / calls as f64;
    assert_eq!(
        hits, calls,
        "stepped probe counts every getppid exactly once"
    );
    assert_eq!(t.stats().step_overs, calls);
    let flushes1 = guest.tb_flushes();
    eprintln!(
        "FIGURE stepped hit (stop + step-over stop): {stepped_ms:.2} ms per hit; TB flushes {:.2} per hit",
        (flushes1 - flushes0) as f64 / calls as f64
    );

    // --- boosted probe: out-of-line slot in unused kernel text, one stop per hit ---
    let mut code = [0u8; 16];
    t.read_memory(RuntimeAddr(getppid), &mut code).unwrap();
    let mut dec = iced_x86::Decoder::with_ip(64, &code, getppid, iced_x86::DecoderOptions::NONE);
    let first = dec.decode();
    eprintln!(
        "first instruction of __x64_sys_getppid: {first} ({} bytes)",
        first.len()
    );
    assert!(
        !first.is_ip_rel_memory_operand() && first.flow_control() == iced_x86::FlowControl::Next
    );
    let ilen = first.len() as u64;
    let slot = t.alloc_scratch(RuntimeAddr(getppid), 32).unwrap();
    eprintln!("scratch: {:?}", t.scratch_areas());
    let slot_walk = t.translate(GuestVirt(slot.start.0)).unwrap();
    assert!(slot_walk.executable, "the out-of-line area is executable");
    let mut oea = code[..ilen as usize].to_vec();
    let back = (getppid + ilen).wrapping_sub(slot.start.0 + ilen + 5) as i64;
    let back = i32::try_from(back).expect("slot within ±2 GiB");
    oea.push(0xe9);
    oea.extend_from_slice(&back.to_le_bytes());
    let mut scratch_before = vec![0u8; oea.len()];
    t.read_memory(slot.start, &mut scratch_before).unwrap();
    t.write_memory(slot.start, &oea).unwrap();
    let mut check = vec![0u8; oea.len()];
    t.read_memory_direct(GuestVirt(slot.start.0), &mut check)
        .unwrap();
    assert_eq!(
        check, oea,
        "M wrote a read-only guest text page (seen in guest RAM)"
    );
    let steps_before = t.stats().step_overs;
    t.resume_all().unwrap();
    guest.send_line(&format!("getppid {calls}"));
    let t0 = Instant::now();
    let hits = run_until(
        &mut guest,
        &mut t,
        &format!("@getppid {calls} done"),
        |t, th, _, mut regs| {
            regs.rip = slot.start.0;
            t.set_registers(th, &regs).unwrap();
            t.resume(th, ResumeMode::Continue).unwrap();
        },
    );
    let boosted_ms = t0.elapsed().as_secs_f64() * 1e3 / calls as f64;
    assert_eq!(
        hits, calls,
        "boosted probe counts every getppid exactly once"
    );
    assert_eq!(
        t.stats().step_overs,
        steps_before,
        "boosted hits take no step"
    );
    let flushes2 = guest.tb_flushes();
    eprintln!(
        "FIGURE boosted hit (one stop, rip moved to the OEA): {boosted_ms:.2} ms per hit; TB flushes {:.2} per hit",
        (flushes2 - flushes1) as f64 / calls as f64
    );
    t.stop_all().unwrap();
    t.remove_breakpoint(RuntimeAddr(getppid)).unwrap();

    // --- post handler through a single step ---
    t.insert_breakpoint(RuntimeAddr(getppid)).unwrap();
    t.resume_all().unwrap();
    guest.send_line("getppid 1");
    let mut stepped_to = 0;
    let hits = run_until(&mut guest, &mut t, "@getppid 1 done", |t, th, _, _| {
        t.resume(th, ResumeMode::Step).unwrap();
        match t.wait(Some(LONG)).unwrap() {
            TargetEvent::Stepped { thread, regs } => {
                assert_eq!(thread, th);
                stepped_to = regs.rip;
            }
            other => panic!("expected Stepped, got {other:?}"),
        }
        t.resume(th, ResumeMode::Continue).unwrap();
    });
    assert_eq!(hits, 1);
    assert_eq!(
        stepped_to,
        getppid + ilen,
        "one step executes exactly the probed instruction"
    );
    t.stop_all().unwrap();
    t.remove_breakpoint(RuntimeAddr(getppid)).unwrap();

    // --- openat: argument from pt_regs, return value by a breakpoint at the return address ---
    t.insert_breakpoint(RuntimeAddr(openat)).unwrap();
    t.resume_all().unwrap();
    let path = "/tmp/probe-me.txt";
    guest.send_line(&format!("open {path}"));
    let mut seen_path = None;
    let mut ret: Option<(u64, u64)> = None; // (return address, rsp after return)
    let mut seen_fd = None;
    let done = format!("@open {path} fd=");
    let deadline = Instant::now() + LONG;
    while seen_fd.is_none() || !guest.seen(&done) {
        assert!(Instant::now() < deadline, "openat probe never completed");
        match t.wait(Some(Duration::from_millis(100))).unwrap() {
            TargetEvent::Breakpoint { thread, addr, regs } if addr.0 == openat => {
                // __x64_sys_openat(const struct pt_regs *regs): filename in regs->si
                let mut si = [0u8; 8];
                t.read_memory(RuntimeAddr(regs.rdi + 13 * 8), &mut si)
                    .unwrap();
                let mut name = [0u8; 64];
                t.read_memory(RuntimeAddr(u64::from_le_bytes(si)), &mut name)
                    .unwrap();
                let s = String::from_utf8_lossy(
                    &name[..name.iter().position(|b| *b == 0).unwrap_or(64)],
                )
                .into_owned();
                if s == path && ret.is_none() {
                    let mut ra = [0u8; 8];
                    t.read_memory(RuntimeAddr(regs.rsp), &mut ra).unwrap();
                    let ra = u64::from_le_bytes(ra);
                    ret = Some((ra, regs.rsp + 8));
                    t.insert_breakpoint(RuntimeAddr(ra)).unwrap();
                    seen_path = Some(s);
                }
                t.resume(thread, ResumeMode::Continue).unwrap();
            }
            TargetEvent::Breakpoint { thread, addr, regs } => {
                let (ra, sp) = ret.expect("a return breakpoint");
                assert_eq!(addr.0, ra);
                if regs.rsp == sp {
                    seen_fd = Some(regs.rax as i64);
                    t.remove_breakpoint(addr).unwrap();
                }
                t.resume(thread, ResumeMode::Continue).unwrap();
            }
            TargetEvent::Timeout => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        seen_path.as_deref(),
        Some(path),
        "file name read from guest user memory"
    );
    let fd_line = guest.wait_for("\n", Duration::from_secs(5));
    let printed: i64 = String::from_utf8_lossy(&fd_line).trim().parse().unwrap();
    assert_eq!(
        seen_fd,
        Some(printed),
        "return value seen at the return address == fd printed"
    );

    // --- detach: text and scratch as before, guest keeps running ---
    let (cr3, cr4) = (t.registers(cpu0).unwrap_or_default().cr3, 0);
    t.detach().unwrap();
    let mut ram = RamFile::open(&guest.ram_file).unwrap();
    let cr3 = if cr3 != 0 { cr3 } else { regs.cr3 };
    for (a, before) in &text_before {
        let mut now = vec![0u8; before.len()];
        mem::read_virt(&mut ram, cr3, cr4, GuestVirt(*a), &mut now).unwrap();
        assert_eq!(&now, before, "kernel text at {a:#x} as before after detach");
    }
    let mut now = vec![0u8; scratch_before.len()];
    mem::read_virt(&mut ram, cr3, cr4, GuestVirt(slot.start.0), &mut now).unwrap();
    assert_eq!(
        now, scratch_before,
        "out-of-line area restored after detach"
    );
    guest.send_line("getppid 5");
    guest.wait_for("@getppid 5 done", LONG);

    // --- a stub that goes away is Exited(Disconnected), not a hang or panic ---
    let mut cfg = GuestConfig::new(StubAddr::Unix(guest.gdb_socket.clone()));
    cfg.timeout = Duration::from_secs(10);
    let mut t = GuestTarget::connect(cfg).unwrap();
    t.resume_all().unwrap();
    guest.send_line("exit");
    guest.wait_for("@FINAL rc=0", LONG);
    let ev = t.wait(Some(LONG)).unwrap();
    assert!(
        matches!(ev, TargetEvent::Exited(ExitStatus::Disconnected(_))),
        "{ev:?}"
    );
    assert!(t.read_memory(RuntimeAddr(getppid), &mut [0u8; 4]).is_err());
    assert!(
        guest.wait_exit(Duration::from_secs(30)),
        "QEMU exits after the guest powers off"
    );
}
