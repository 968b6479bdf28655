//! Typed values copied in the target (issue 23 item 5): strings (passed
//! and returned), a field through a pointer and the 7th and 8th
//! (stack-passed) arguments of
//! functions on the patch mechanism are read by the agent at each entry,
//! with no ptrace stop: the run's ptrace stops are the same for 10 calls
//! and for 1,000. Every value shown is the one the program logged; a
//! string pointer into unmapped memory shows as unreadable, a string
//! longer than 128 bytes or running into an unmapped page as cut, and the
//! program's output and exit status are unchanged.

mod support;

use hotprobe::typed_capture::TypedCapture;
use hotprobe::{Mechanism, RunEnd, Session, SessionConfig, SpawnOptions};
use std::sync::atomic::AtomicBool;
use support::{lines_with, program};

/// What one run showed.
struct Run {
    /// `name(values) = ret` per call, in order, as the capture typed them.
    calls: Vec<String>,
    /// ptrace stops between the start and the end of the run.
    stops: u64,
    /// The program's output.
    out: String,
    /// How it ended.
    end: RunEnd,
}

fn run(n: u32, trap: bool) -> Run {
    let bin = program("typed_fast", &["-O1", "-fpatchable-function-entry=5"]);
    let out = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("typed-fast-{}-{n}", std::process::id()));
    let mut config = SessionConfig::default();
    config.fast_path.record_args = 6;
    if trap {
        config.mechanism = hotprobe::MechanismChoice::Trap;
    }
    let mut session = Session::with_config(config);
    let t = session
        .spawn_with(
            &bin,
            &[n.to_string().into()],
            &SpawnOptions {
                stdout: Some(std::fs::File::create(&out).unwrap()),
                ..Default::default()
            },
        )
        .unwrap();
    let mut typed = TypedCapture::new();
    let mut names = std::collections::HashMap::new();
    for spec in ["word", "slen", "tag", "eight", "getx(p->x)"] {
        let added = typed.place(&mut session, t, spec).unwrap();
        let p = &added.placements[0];
        if trap {
            assert_eq!(p.mechanism, Mechanism::Trap, "{spec}");
            names.insert(p.id, spec.split('(').next().unwrap().to_string());
            continue;
        }
        assert!(
            matches!(p.mechanism, Mechanism::Patch(_)),
            "{spec}: {:?} ({})",
            p.mechanism,
            p.reason
        );
        assert!(
            p.reason.contains("typed values copied in the target"),
            "{spec}: {}",
            p.reason
        );
        names.insert(p.id, spec.split('(').next().unwrap().to_string());
    }
    session.start().unwrap();
    let before = session.ptrace_stops(t).unwrap();
    let stop = AtomicBool::new(false);
    let end = typed.with_sink(None, |sink| session.run_with(&stop, Some(sink)).unwrap());
    let stops = session.ptrace_stops(t).unwrap() - before;
    // Entries and their returns, paired per function (no recursion).
    let mut open: std::collections::HashMap<_, String> = Default::default();
    let mut calls = Vec::new();
    for ev in typed.take_events() {
        let name = &names[&ev.probe];
        if ev.exit {
            let entry = open.remove(&ev.probe).expect("an exit without its entry");
            calls.push(format!("{entry} = {}", ev.values.join(", ")));
        } else {
            open.insert(ev.probe, format!("{name}({})", ev.values.join(", ")));
        }
    }
    Run {
        calls,
        stops,
        out: std::fs::read_to_string(&out).unwrap(),
        end,
    }
}

#[test]
fn strings_fields_and_stack_arguments_are_copied_without_ptrace_stops() {
    let few = run(10, false);
    let many = run(1000, false);
    // The same values through the trap (the trap path's capture), whose
    // stops the count sees: what the copy in the target saves.
    let trapped = run(10, true);
    assert!(trapped.stops >= 2 * 44, "{} stops", trapped.stops);
    assert_eq!(trapped.calls, few.calls);
    for r in [&few, &many] {
        let logged: Vec<String> = lines_with(&r.out, "CALL ")
            .iter()
            .map(|l| l["CALL ".len()..].to_string())
            // The program logs the unmapped pointer as its number.
            .map(|l| l.replace("tag(1, 41)", "tag(<unreadable 0x1>, 41)"))
            // Strings are shown escaped, as C literals.
            .map(|l| l.replace("be\"ta", "be\\\"ta"))
            .collect();
        assert_eq!(r.calls, logged);
        assert_eq!(r.end, RunEnd::AllExited);
    }
    // Four functions per round, then tag's unreadable pointer, the long
    // string, the string of exactly 128 bytes and the string running into
    // an unmapped page.
    assert_eq!(few.calls.len(), 4 * 10 + 4);
    assert_eq!(many.calls.len(), 4 * 1000 + 4);
    // The program's own results, as it computes them untraced.
    let untraced = std::process::Command::new(program(
        "typed_fast",
        &["-O1", "-fpatchable-function-entry=5"],
    ))
    .arg("1000")
    .output()
    .unwrap();
    assert_eq!(untraced.status.code(), Some(7));
    assert_eq!(String::from_utf8(untraced.stdout).unwrap(), many.out);
    // No ptrace stop per hit: 100 times the calls, the same stops.
    assert_eq!(few.stops, many.stops, "ptrace stops grew with the calls");
}
