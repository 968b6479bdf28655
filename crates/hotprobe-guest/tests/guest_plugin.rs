//! hotprobe's QEMU plugin through `Session`, on the test guest started by
//! hotprobe (`hotprobe_guest::launch`): counts, records with arguments and
//! guest strings read in the plugin, both delivery modes, filters, return
//! counts, the GDB stub beside the plugin on the same guest (handlers, and
//! probes added once the guest ran), and a probe enabled and disabled 100
//! times without a single translation-cache flush. One boot serves every
//! assertion.

#[path = "guest/harness.rs"]
mod harness;

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::Console;
use hotprobe::{
    Action, EventSink, Mechanism, PluginOptions, Probe, ProbeId, RecordedEvent, RunEnd, Session,
    SinkError, TargetId, KIND_ENTRY, KIND_EXIT,
};
use hotprobe_guest::{launch, load_symbols, LaunchOptions};
use hotprobe_qemu::{Delivery, Fetch, StringFetch};

const LONG: Duration = Duration::from_secs(120);

/// Events with their data, by probe.
#[derive(Default)]
struct Collect {
    events: Vec<(RecordedEvent, Vec<u8>)>,
    lost: u64,
}

impl EventSink for Collect {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError> {
        self.events.push((*ev, Vec::new()));
        Ok(())
    }
    fn event_data(&mut self, ev: &RecordedEvent, data: &[u8]) -> Result<(), SinkError> {
        self.events.push((*ev, data.to_vec()));
        Ok(())
    }
    fn lost(&mut self, _tid: u32, _ts: u64, count: u64) -> Result<(), SinkError> {
        self.lost += count;
        Ok(())
    }
}

impl Collect {
    fn of(&self, id: ProbeId, kind: u8) -> Vec<&(RecordedEvent, Vec<u8>)> {
        self.events
            .iter()
            .filter(|(e, _)| e.probe_id == id.0 && e.kind == kind)
            .collect()
    }
}

/// Runs the session (draining into `sink`) until `marker` shows on the
/// console.
fn run_until(s: &mut Session, con: &mut Console, sink: &mut Collect, marker: &str) {
    let wake = Arc::new(AtomicBool::new(false));
    let w2 = wake.clone();
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let ticker = std::thread::spawn(move || {
        while !d2.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
            w2.store(true, Ordering::SeqCst);
        }
    });
    let t0 = Instant::now();
    loop {
        assert!(t0.elapsed() < LONG, "{marker:?} never came");
        wake.store(false, Ordering::SeqCst);
        match s.run_with(&wake, Some(sink)).expect("session healthy") {
            RunEnd::Interrupted => {}
            other => panic!("run ended: {other:?}"),
        }
        if con.seen(marker) {
            break;
        }
    }
    // Events of the last calls are in the rings: one more drain.
    drain(s, sink);
    done.store(true, Ordering::SeqCst);
    ticker.join().unwrap();
}

/// The offset of the first instruction of getppid the engine boosts (the
/// entry is an ftrace NOP, emulated).
fn first_boosted_offset(s: &mut Session, t: TargetId) -> u64 {
    let func = s.resolve(t, "__x64_sys_getppid").unwrap()[0].addr.0;
    let mut code = [0u8; 96];
    s.engine(t)
        .unwrap()
        .target()
        .read_memory(hotprobe::RuntimeAddr(func), &mut code)
        .unwrap();
    let mut off = 0usize;
    while off + 16 <= code.len() {
        let plan = hotprobe_x86::plan_probe(&code[off..], func + off as u64, func + off as u64)
            .expect("plannable");
        if plan.execution == hotprobe_x86::Execution::Boost {
            return off as u64;
        }
        off += plan.len;
    }
    panic!("no boostable instruction in the first bytes of getppid");
}

/// One drain of the rings into `sink`.
fn drain(s: &mut Session, sink: &mut Collect) {
    let wake = AtomicBool::new(true);
    s.run_with(&wake, Some(sink)).unwrap();
}

fn add(s: &mut Session, t: TargetId, spec: &str, action: Action, o: &PluginOptions) -> ProbeId {
    let a = s.add_plugin(t, spec, action, o).unwrap();
    assert_eq!(a.placements.len(), 1);
    let p = &a.placements[0];
    assert_eq!(p.mechanism, Mechanism::Plugin, "{spec}: {}", p.reason);
    p.id
}

#[test]
fn plugin_probes_through_the_session() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("\n!!!!!!!! SKIPPED plugin_probes_through_the_session: {why} !!!!!!!!\n");
        return;
    }
    let (syms, _) = load_symbols(&harness::kallsyms_cached()).unwrap();
    let dir = std::env::temp_dir().join(format!("hp-plugin-sess-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t0 = Instant::now();
    let mut g = launch(
        // The workload is init: a short boot, and no other process.
        &harness::qemu_args(&dir, "rdinit=/workload"),
        syms,
        LaunchOptions {
            stdin: Some(Stdio::piped()),
            stdout: Some(Stdio::piped()),
            ..LaunchOptions::default()
        },
    )
    .unwrap();
    g.qemu.kill_on_drop = true;
    let mut con = Console::new(
        g.qemu.child.stdin.take(),
        g.qemu.child.stdout.take().unwrap(),
    );
    let mut s = Session::new();
    let t = s.add_plugin_guest(Box::new(g.target), Some(Box::new(g.resolver)), g.plugin);

    // Every probe disabled until the workload is READY (boot noise).
    let off = |delivery| PluginOptions {
        delivery,
        enabled: false,
        ..PluginOptions::default()
    };
    let count = add(
        &mut s,
        t,
        "__x64_sys_getppid",
        Action::Count,
        &off(Delivery::Async),
    );
    let toggled = add(
        &mut s,
        t,
        "__x64_sys_getppid",
        Action::Count,
        &off(Delivery::Async),
    );
    let rets = add(
        &mut s,
        t,
        "__x64_sys_getppid%return",
        Action::Count,
        &off(Delivery::Async),
    );
    let rec_async = add(
        &mut s,
        t,
        "__x64_sys_getppid",
        Action::Record,
        &off(Delivery::Async),
    );
    let rec_sync = add(
        &mut s,
        t,
        "__x64_sys_getppid",
        Action::Record,
        &off(Delivery::Sync),
    );
    // The first argument of getppid as the workload passed it: pt_regs->di.
    let magic = 0x5eed_u64;
    let filtered = add(
        &mut s,
        t,
        "__x64_sys_getppid",
        Action::Count,
        &PluginOptions {
            values: Some(vec![Fetch::pt_regs_field(14)]),
            filter_value: Some((0, magic)),
            ..off(Delivery::Async)
        },
    );
    let other_cr3 = add(
        &mut s,
        t,
        "__x64_sys_getppid",
        Action::Count,
        &PluginOptions {
            filter_cr3: Some(0x1234_5000),
            ..off(Delivery::Async)
        },
    );
    // openat(dfd, filename, ...): pt_regs->di, pt_regs->si, and the path.
    let open_opts = |delivery| PluginOptions {
        values: Some(vec![Fetch::pt_regs_field(14), Fetch::pt_regs_field(13)]),
        string: Some(StringFetch {
            index: 1,
            max_len: 160,
        }),
        ..off(delivery)
    };
    let open_async = add(
        &mut s,
        t,
        "__x64_sys_openat",
        Action::Record,
        &open_opts(Delivery::Async),
    );
    let open_sync = add(
        &mut s,
        t,
        "__x64_sys_openat",
        Action::Record,
        &open_opts(Delivery::Sync),
    );
    let all = [
        count, rets, rec_async, rec_sync, filtered, other_cr3, open_async, open_sync,
    ];

    s.start().unwrap();
    let mut sink = Collect::default();
    run_until(&mut s, &mut con, &mut sink, "@READY");
    eprintln!("booted to READY in {:?}", t0.elapsed());
    for id in all {
        s.set_enabled(id, true).unwrap();
    }

    // --- counts, records, filters, returns ---
    let n = 1000u64;
    con.send_line(&format!("getppid {n} {magic:#x}"));
    run_until(&mut s, &mut con, &mut sink, &format!("@getppid {n} done"));
    con.send_line("getppid 7");
    run_until(&mut s, &mut con, &mut sink, "@getppid 7 done");
    let paths = ["/init", "/no/such/file", "/proc/self/status"];
    for p in paths {
        con.send_line(&format!("open {p}"));
        run_until(&mut s, &mut con, &mut sink, &format!("@open {p} fd="));
    }
    for id in all {
        s.set_enabled(id, false).unwrap();
    }
    drain(&mut s, &mut sink);
    let st = |s: &Session, id| s.stats(id).unwrap();
    assert_eq!(st(&s, count).hits, n + 7, "count");
    assert_eq!(st(&s, rets).returns, n + 7, "%return count");
    assert_eq!(
        st(&s, filtered).hits,
        n,
        "value filter keeps the calls with {magic:#x}"
    );
    assert_eq!(st(&s, other_cr3).hits, 0, "cr3 filter");
    for (id, what) in [(rec_async, "async"), (rec_sync, "sync")] {
        assert_eq!(st(&s, id).hits, n + 7, "{what} record hits");
        assert_eq!(
            sink.of(id, KIND_ENTRY).len() as u64,
            n + 7,
            "{what} entries"
        );
        assert_eq!(sink.of(id, KIND_EXIT).len() as u64, n + 7, "{what} exits");
    }
    // getppid returns the parent's pid: the workload is init, so 0.
    assert!(sink
        .of(rec_async, KIND_EXIT)
        .iter()
        .all(|(e, _)| e.args[0] == 0));
    for (id, what) in [(open_async, "async"), (open_sync, "sync")] {
        let opened: Vec<String> = sink
            .of(id, KIND_ENTRY)
            .iter()
            .map(|(_, d)| String::from_utf8_lossy(d).into_owned())
            .collect();
        assert_eq!(opened, paths, "{what}: openat paths read in the plugin");
        let dfd = sink.of(id, KIND_ENTRY)[0].0.args[0] as i64 as i32;
        assert_eq!(dfd, -100, "AT_FDCWD in pt_regs->di");
        let rets: Vec<i64> = sink
            .of(id, KIND_EXIT)
            .iter()
            .map(|(e, _)| e.args[0] as i64)
            .collect();
        assert_eq!(rets.len(), 3);
        assert!(
            rets[0] >= 0 && rets[1] == -2 && rets[2] >= 0,
            "{what}: {rets:?}"
        );
    }
    assert_eq!(sink.lost, 0);

    // --- the stub on the same guest: a handler (it could write), and a
    // probe added once the guest ran (not a candidate of the plugin), on an
    // instruction of getppid after the plugin's entry site ---
    let spec = format!("__x64_sys_getppid+{:#x}", first_boosted_offset(&mut s, t));
    let stub_hits = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let h2 = stub_hits.clone();
    let handler = s
        .add(
            t,
            &spec,
            Action::Handler(Probe::new().pre(move |_| h2.set(h2.get() + 1))),
        )
        .unwrap();
    assert_eq!(handler.placements[0].mechanism, Mechanism::Stub);
    let late = s.add(t, &spec, Action::Count).unwrap();
    let late_p = &late.placements[0];
    assert_eq!(late_p.mechanism, Mechanism::Stub, "{}", late_p.reason);
    assert!(
        late_p.reason.contains("not a candidate"),
        "{}",
        late_p.reason
    );
    s.set_enabled(count, true).unwrap();
    con.send_line("getppid 20");
    run_until(&mut s, &mut con, &mut sink, "@getppid 20 done");
    s.set_enabled(count, false).unwrap();
    assert_eq!(stub_hits.get(), 20, "stub handler");
    assert_eq!(st(&s, late_p.id).hits, 20, "late count on the stub");
    assert_eq!(st(&s, count).hits, n + 7 + 20, "the plugin beside the stub");
    s.remove_probe(handler.placements[0].id).unwrap();
    s.remove_probe(late_p.id).unwrap();
    // On the plugin's own site the stub would hide executions from it: said.
    let same = s
        .add(t, "__x64_sys_getppid", Action::Handler(Probe::new()))
        .unwrap();
    let notices = s.take_notices();
    assert!(
        notices.iter().any(|n| n.contains("not seen by the plugin")),
        "{notices:?}"
    );
    s.remove_probe(same.placements[0].id).unwrap();

    // --- a probe enabled and disabled 100 times while the workload runs ---
    let flushes0 = harness::tb_flushes_at(&dir.join("monitor.sock"));
    let mut expected = 0;
    let before = st(&s, toggled).hits;
    assert_eq!(before, 0);
    for i in 0..100u64 {
        s.set_enabled(toggled, true).unwrap();
        let k = 1 + i % 5;
        expected += k;
        con.send_line(&format!("getppid {k}"));
        run_until(&mut s, &mut con, &mut sink, &format!("@getppid {k} done"));
        s.set_enabled(toggled, false).unwrap();
        con.send_line("getppid 3");
        run_until(&mut s, &mut con, &mut sink, "@getppid 3 done");
    }
    assert_eq!(st(&s, toggled).hits, expected, "calls made while enabled");
    let flushes1 = harness::tb_flushes_at(&dir.join("monitor.sock"));
    assert_eq!(
        flushes1, flushes0,
        "no translation-cache flush from enabling"
    );
    let ps = s.plugin_stats(t).unwrap();
    eprintln!(
        "plugin {ps:?}, TB flushes {flushes0} -> {flushes1}, total {:?}",
        t0.elapsed()
    );
    assert_eq!(
        ps.early_translations, 0,
        "nothing translated before the freeze"
    );
    assert_eq!(ps.sync_timeouts, 0);

    con.send_line("exit");
    let wake = AtomicBool::new(false);
    let end = s.run_with(&wake, Some(&mut sink)).unwrap();
    assert_eq!(
        end,
        RunEnd::AllExited,
        "the guest powered off: the stream ends"
    );
    assert!(g.qemu.wait_timeout(Duration::from_secs(30)).is_some());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A guest started with the plugin, its console ours.
fn launch_guest(tag: &str) -> (hotprobe_guest::LaunchedGuest, Console, std::path::PathBuf) {
    let (syms, _) = load_symbols(&harness::kallsyms_cached()).unwrap();
    let dir = std::env::temp_dir().join(format!("hp-plugin-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut g = launch(
        &harness::qemu_args(&dir, "rdinit=/workload"),
        syms,
        LaunchOptions {
            stdin: Some(Stdio::piped()),
            stdout: Some(Stdio::piped()),
            ..LaunchOptions::default()
        },
    )
    .unwrap();
    g.qemu.kill_on_drop = true;
    let con = Console::new(
        g.qemu.child.stdin.take(),
        g.qemu.child.stdout.take().unwrap(),
    );
    (g, con, dir)
}

/// Two guests in one session, each with its plugin: each count is its own
/// guest's calls; killing one QEMU leaves the other and the session
/// healthy (its probes count on, the session ends when the second one
/// powers off).
#[test]
fn two_guests_in_one_session() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("\n!!!!!!!! SKIPPED two_guests_in_one_session: {why} !!!!!!!!\n");
        return;
    }
    let (ga, mut con_a, dir_a) = launch_guest("two-a");
    let (gb, mut con_b, dir_b) = launch_guest("two-b");
    let mut qemu_a = ga.qemu;
    let mut qemu_b = gb.qemu;
    let mut s = Session::new();
    let ta = s.add_plugin_guest(Box::new(ga.target), Some(Box::new(ga.resolver)), ga.plugin);
    let tb = s.add_plugin_guest(Box::new(gb.target), Some(Box::new(gb.resolver)), gb.plugin);
    let off = PluginOptions {
        enabled: false,
        ..PluginOptions::default()
    };
    let ca = add(&mut s, ta, "__x64_sys_getppid", Action::Count, &off);
    let cb = add(&mut s, tb, "__x64_sys_getppid", Action::Count, &off);
    let sync = PluginOptions {
        delivery: Delivery::Sync,
        ..off.clone()
    };
    let rb = add(&mut s, tb, "__x64_sys_getppid", Action::Record, &sync);
    s.start().unwrap();
    let mut sink = Collect::default();
    run_until(&mut s, &mut con_a, &mut sink, "@READY");
    run_until(&mut s, &mut con_b, &mut sink, "@READY");
    for id in [ca, cb, rb] {
        s.set_enabled(id, true).unwrap();
    }
    con_a.send_line("getppid 300");
    con_b.send_line("getppid 500");
    run_until(&mut s, &mut con_a, &mut sink, "@getppid 300 done");
    run_until(&mut s, &mut con_b, &mut sink, "@getppid 500 done");
    let hits = |s: &Session, id| s.stats(id).unwrap().hits;
    assert_eq!(hits(&s, ca), 300, "guest A's count");
    assert_eq!(hits(&s, cb), 500, "guest B's count");
    assert_eq!(sink.of(rb, KIND_ENTRY).len(), 500, "guest B's events");

    // Guest A dies; B and the session go on.
    qemu_a.kill();
    con_b.send_line("getppid 200");
    run_until(&mut s, &mut con_b, &mut sink, "@getppid 200 done");
    assert_eq!(hits(&s, cb), 700, "guest B counts on after A died");
    assert_eq!(sink.of(rb, KIND_ENTRY).len(), 700);
    assert_eq!(sink.of(rb, KIND_EXIT).len(), 700);
    assert_eq!(hits(&s, ca), 300, "guest A's count is kept");
    let notices = s.take_notices();
    eprintln!("notices after A died: {notices:?}");
    assert_eq!(s.plugin_stats(tb).unwrap().sync_timeouts, 0);

    con_b.send_line("exit");
    let wake = AtomicBool::new(false);
    let end = s.run_with(&wake, Some(&mut sink)).unwrap();
    assert_eq!(end, RunEnd::AllExited, "both guests gone: the stream ends");
    assert!(qemu_b.wait_timeout(Duration::from_secs(30)).is_some());
    let _ = std::fs::remove_dir_all(&dir_a);
    let _ = std::fs::remove_dir_all(&dir_b);
}
