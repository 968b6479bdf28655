//! `stacks.tsv` (trace format 4): written stacks read back, folded and
//! grouped by caller; a malformed file is an error, never a panic (a
//! bounded fuzz pass); a trace without the file has no stacks.

use hotprobe_fuzzcheck::Fuzz;
use hotprobe_trace::stacks::*;

fn sample() -> Vec<CapturedStack> {
    let st = |f: &str, callers: &[&str], truncated, count| CapturedStack {
        function: f.to_string(),
        callers: callers.iter().map(|s| s.to_string()).collect(),
        truncated,
        count,
    };
    vec![
        st("malloc", &["leaf", "a", "main"], false, 3),
        st("malloc", &["leaf", "b", "main"], false, 5),
        st("malloc", &["x;y", "main"], true, 2),
        st("free", &[], false, 1),
    ]
}

fn tmp(tag: &str) -> std::path::PathBuf {
    let d = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(tag);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn stacks_round_trip_fold_and_callers() {
    let d = tmp("stacks-file");
    assert_eq!(read_stacks(&d).unwrap(), None);
    write_stacks(&d, &sample()).unwrap();
    let back = read_stacks(&d).unwrap().unwrap();
    // `;` is a separator: it becomes a space in a name.
    let mut want = sample();
    want[2].callers[0] = "x y".into();
    assert_eq!(back, want);
    assert_eq!(
        folded_stacks(&back),
        "[truncated];main;x y;malloc 2\nfree 1\nmain;a;leaf;malloc 3\nmain;b;leaf;malloc 5\n"
    );
    let c = callers_of(&back, |f| f == "malloc");
    assert_eq!(
        c.iter()
            .map(|c| (c.caller.as_str(), c.count))
            .collect::<Vec<_>>(),
        [("leaf", 8), ("x y", 2)]
    );
    assert_eq!(c[0].paths[0].2, 5);
}

#[test]
fn fuzz_stacks_tsv() {
    let d = tmp("stacks-fuzz");
    write_stacks(&d, &sample()).unwrap();
    let seed = std::fs::read(d.join(STACKS_FILE)).unwrap();
    let path = d.join(STACKS_FILE);
    let report = Fuzz::new("stacks_tsv")
        .seed(seed)
        .tokens(["\t", "\n", ";", "0", "1", "18446744073709551616", "-1"])
        .iterations(3_000)
        .run(|data| {
            std::fs::write(&path, data).unwrap();
            match read_stacks(&d) {
                Ok(Some(s)) => {
                    let _ = folded_stacks(&s);
                    let _ = callers_of(&s, |_| true);
                    true
                }
                _ => false,
            }
        });
    assert!(report.accepted > 0, "{report:?}");
}
