//! One Session, every mechanism, on one target at once: patch and jump
//! counts, records with arguments and return values, and a trap handler
//! that writes a register — all through `hotprobe::Session` alone.

mod support;

use hotprobe::{
    Action, EventSink, Mechanism, RecordedEvent, RetProbe, RunEnd, SinkError, KIND_ENTRY, KIND_EXIT,
};
use std::sync::atomic::AtomicBool;
use support::*;

/// Keeps every recorded event.
#[derive(Default)]
struct Collect(Vec<RecordedEvent>);

impl EventSink for Collect {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError> {
        self.0.push(*ev);
        Ok(())
    }
    fn lost(&mut self, _tid: u32, _ts: u64, count: u64) -> Result<(), SinkError> {
        panic!("{count} events lost");
    }
}

#[test]
fn patch_jump_record_and_a_register_writing_handler_on_one_target() {
    let bin = program("mixed", &["-O2"]);
    let native = std::process::Command::new(&bin)
        .arg("200")
        .output()
        .unwrap();
    let native = String::from_utf8(native.stdout).unwrap();

    let mut t = spawn(&bin, &["200"]);
    let s = &mut t.session;
    let patched = s.add(t.target, "patched", Action::Count).unwrap();
    let jumped = s.add(t.target, "jumped", Action::Count).unwrap();
    let recorded = s.add(t.target, "recorded", Action::Record).unwrap();
    let forced = s
        .add(
            t.target,
            "forced",
            Action::Return(RetProbe::new(4).ret(|ctx| ctx.regs_mut().rax = 42)),
        )
        .unwrap();
    let p = &patched.placements[0];
    let j = &jumped.placements[0];
    let r = &recorded.placements[0];
    let f = &forced.placements[0];
    assert!(matches!(p.mechanism, Mechanism::Patch(_)), "{p:?}");
    assert_eq!(j.mechanism, Mechanism::Jump, "{j:?}");
    assert_eq!(r.mechanism, Mechanism::Jump, "{r:?}");
    assert_eq!(f.mechanism, Mechanism::Trap, "{f:?}");

    // The fast path's own pages are in the blacklist, as the engine's
    // scratch memory is.
    let jump_pages = s
        .blacklist(t.target)
        .unwrap()
        .into_iter()
        .filter(|b| b.what.contains("fast-path"))
        .count();
    assert!(jump_pages >= 1, "the jump trampolines' page is blacklisted");

    s.start().unwrap();
    let mut sink = Collect::default();
    let end = s
        .run_with(&AtomicBool::new(false), Some(&mut sink))
        .unwrap();
    assert_eq!(end, RunEnd::AllExited);

    assert_eq!(s.stats(p.id).unwrap().hits, 200);
    assert_eq!(s.stats(j.id).unwrap().hits, 200);
    assert_eq!(s.stats(r.id).unwrap().hits, 5);
    assert_eq!(s.stats(f.id).unwrap().returns, 3);
    assert_eq!(s.exit_status(t.target), Some(hotprobe::ExitStatus::Code(0)));

    // The program's output: unchanged but for the rewritten results.
    let out = t.output();
    let expected = native
        .lines()
        .map(|l| {
            if l.starts_with("forced ") {
                "forced 42"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    assert_eq!(out, expected);

    // Entries carry the arguments, exits the printed return values.
    let mine: Vec<&RecordedEvent> = sink.0.iter().filter(|e| e.probe_id == r.id.0).collect();
    let entries: Vec<(u64, u64)> = mine
        .iter()
        .filter(|e| e.kind == KIND_ENTRY)
        .map(|e| (e.args[0], e.args[1]))
        .collect();
    let exits: Vec<u64> = mine
        .iter()
        .filter(|e| e.kind == KIND_EXIT)
        .map(|e| e.args[0])
        .collect();
    assert_eq!(entries, (0..5).map(|i| (i, i + 1)).collect::<Vec<_>>());
    let printed: Vec<u64> = lines_with(&out, "recorded ")
        .iter()
        .map(|l| l["recorded ".len()..].parse().unwrap())
        .collect();
    assert_eq!(exits, printed);
    assert!(mine.windows(2).all(|w| w[0].tsc <= w[1].tsc));
}

#[test]
fn a_forced_mechanism_that_cannot_apply_is_refused_before_anything_is_written() {
    let bin = program("mixed", &["-O2"]);
    let mut session = hotprobe::Session::with_config(hotprobe::SessionConfig {
        mechanism: hotprobe::MechanismChoice::Patch,
        ..Default::default()
    });
    let t = session.spawn(&bin, &["3".into()]).unwrap();
    let e = session.add(t, "jumped", Action::Count).unwrap_err();
    assert!(e.to_string().contains("patch"), "{e}");
    // The placeholder function still takes it.
    let ok = session.add(t, "patched", Action::Count).unwrap();
    assert!(matches!(ok.placements[0].mechanism, Mechanism::Patch(_)));
    session.start().unwrap();
    assert_eq!(session.run().unwrap(), RunEnd::AllExited);
    assert_eq!(session.stats(ok.placements[0].id).unwrap().hits, 3);
}
