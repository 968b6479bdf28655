//! The program that logs its own calls (tests/programs/calls.c: tree,
//! arguments, and durations measured inside each call), recorded once per
//! test binary, and what the tests of the questions asked of its trace
//! (`analyse_cli.rs`) and of its exports (`export_cli.rs`) share.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::{gcc, hotprobe, text};

/// The tests' scratch directory.
pub fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("analyse-cli");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// calls.c, built once.
pub fn calls_program() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/calls.c");
        gcc(
            &src,
            &tmp().join("calls"),
            &["-O1", "-fno-inline", "-fno-optimize-sibling-calls"],
        )
    })
    .clone()
}

/// One call as the program logged it.
#[derive(Clone, Debug)]
pub struct Call {
    pub tid: u32,
    pub depth: usize,
    pub name: String,
    pub arg: i64,
    pub t0: u64,
    pub t1: u64,
}

impl Call {
    pub fn dur(&self) -> u64 {
        self.t1 - self.t0
    }
}

/// The program's log: one call a line.
pub fn parse_calls(out: &str) -> Vec<Call> {
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 6, "odd program line {l:?}");
            Call {
                tid: f[0].parse().unwrap(),
                depth: f[1].parse().unwrap(),
                name: f[2].to_string(),
                arg: f[3].parse().unwrap(),
                t0: f[4].parse().unwrap(),
                t1: f[5].parse().unwrap(),
            }
        })
        .collect()
}

/// A recorded run: its trace and the calls the program logged.
pub struct Run {
    pub dir: PathBuf,
    pub calls: Vec<Call>,
}

impl Run {
    pub fn d(&self) -> &str {
        self.dir.to_str().unwrap()
    }
    pub fn tids(&self) -> Vec<u32> {
        let mut t: Vec<u32> = self.calls.iter().map(|c| c.tid).collect();
        t.dedup();
        t
    }
    pub fn count(&self, f: impl Fn(&Call) -> bool) -> u64 {
        self.calls.iter().filter(|c| f(c)).count() as u64
    }
    pub fn per_function(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for c in &self.calls {
            *m.entry(c.name.clone()).or_default() += 1;
        }
        m
    }
}

/// `calls N` recorded with 2 arguments (the program's note_* helpers
/// left out).
pub fn record(n: &str) -> Run {
    let dir = tmp().join(format!("calls{n}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let prog = calls_program();
    let o = hotprobe(&[
        "record",
        "-o",
        dir.to_str().unwrap(),
        "--exclude",
        "note_*",
        "--args",
        "2",
        "--",
        prog.to_str().unwrap(),
        n,
    ]);
    let err = text(&o.stderr);
    assert!(o.status.success(), "record failed: {err}");
    assert!(err.contains("drops:    0 "), "{err}");
    Run {
        dir,
        calls: parse_calls(&text(&o.stdout)),
    }
}

/// `calls 3`, recorded once.
pub fn run3() -> &'static Run {
    static R: OnceLock<Run> = OnceLock::new();
    R.get_or_init(|| record("3"))
}

/// `calls 5`, recorded once.
pub fn run5() -> &'static Run {
    static R: OnceLock<Run> = OnceLock::new();
    R.get_or_init(|| record("5"))
}

/// Runs hotprobe, asserts success, returns stdout.
pub fn ok(args: &[&str]) -> String {
    let o = hotprobe(args);
    assert!(
        o.status.success(),
        "hotprobe {args:?} failed: {}",
        text(&o.stderr)
    );
    text(&o.stdout)
}

/// Runs hotprobe, asserts success, returns stdout parsed as JSON.
pub fn json(args: &[&str]) -> Value {
    let out = ok(args);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// rsvg-convert renders `svg` to a non-empty PNG; its text names `names`.
pub fn check_svg(svg: &Path, names: &[&str]) {
    let s = std::fs::read_to_string(svg).unwrap();
    for n in names {
        assert!(
            s.contains(&format!("<title>{n} (")),
            "{n} not in {}",
            svg.display()
        );
    }
    let png = svg.with_extension("png");
    let _ = std::fs::remove_file(&png);
    let o = Command::new("rsvg-convert")
        .arg("-o")
        .arg(&png)
        .arg(svg)
        .output()
        .expect("rsvg-convert runs (package librsvg2-bin, scripts/setup.sh)");
    assert!(o.status.success(), "rsvg-convert: {}", text(&o.stderr));
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.len() > 1000, "PNG of {} bytes", bytes.len());
    assert_eq!(&bytes[1..4], b"PNG");
}
