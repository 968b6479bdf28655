//! The machinery of ledger_pairs.rs: the generated programs (a leaf per
//! ordered pair, C++ throwing or C `longjmp`ing out of it, the leaves in
//! the program or in a library it opens), the program served line by line
//! (probed, and a native copy to compare with), the placement of one
//! mechanism's probe, and the checks of the counts and of the code.

#![allow(dead_code)]

use hotprobe::{
    Action, EngineError, MechanismChoice, Probe, ProbeId, ProbeStats, Session, SpawnOptions,
    TargetId,
};
use std::cell::Cell;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

/// Calls of `leafK` made while pair K is placed: every third (`i % 3 ==
/// 0`) throws or `longjmp`s out of it.
pub(crate) const CALLS: u32 = 30;
/// The longest one command may take (one still going is a hang).
pub(crate) const LIMIT: Duration = Duration::from_secs(60);

/// One way of probing a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Mech {
    TrapEntry,
    TrapReturn,
    InProcess,
    Patch,
    Jump,
    ShmHandler,
}

pub(crate) const MECHS: [Mech; 6] = [
    Mech::TrapEntry,
    Mech::TrapReturn,
    Mech::InProcess,
    Mech::Patch,
    Mech::Jump,
    Mech::ShmHandler,
];

/// The refusals of a second probe the issue allows: (first, second, a
/// part of the reason). The first mechanism cannot serve the second's
/// action there, and nothing can take both.
pub(crate) const ALLOWED_REFUSALS: &[(Mech, Mech, &str)] = &[];

/// Which program.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Lang {
    /// C++: `leafK` throws, its caller catches.
    Throw,
    /// C: `leafK` `longjmp`s to its caller's `setjmp`.
    Longjmp,
}

/// The program's source: `n` copies of `leaf` and the command loop (`run
/// K N`, a `done K` line after each; `bye` at the end of its input).
pub(crate) fn source(lang: Lang, n: usize) -> String {
    let mut s = String::new();
    let (leave, head) = match lang {
        Lang::Throw => (
            "throw std::runtime_error(\"three\")",
            "#include <cstdio>\n#include <cstdlib>\n#include <stdexcept>\n#include <unistd.h>\n\
             #define LINKAGE extern \"C\"\n",
        ),
        Lang::Longjmp => (
            "longjmp(jb, 1)",
            "#include <setjmp.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
             #define LINKAGE\nstatic jmp_buf jb;\n",
        ),
    };
    s.push_str(head);
    writeln!(s, "#define N {n}").unwrap();
    s.push_str("static volatile long sink;\nstatic long calls[N], returns[N];\n");
    writeln!(
        s,
        "#define LEAF(k) LINKAGE __attribute__((noinline, noipa)) long leaf##k(long i) {{ \\\n\
         calls[k]++; if (i % 3 == 0) {leave}; sink = i; returns[k]++; return i * 2; }}"
    )
    .unwrap();
    for k in 0..n {
        writeln!(s, "LEAF({k})").unwrap();
    }
    let table: Vec<String> = (0..n).map(|k| format!("leaf{k}")).collect();
    writeln!(
        s,
        "static long (*const leaves[N])(long) = {{{}}};",
        table.join(", ")
    )
    .unwrap();
    s.push_str(match lang {
        Lang::Throw => {
            "static void run(int k, long n) {\n\
             long sum = 0, left = 0;\n\
             for (long i = 0; i < n; i++) {\n\
             try { sum += leaves[k](i); } catch (const std::exception &) { left++; }\n\
             }\n"
        }
        Lang::Longjmp => {
            "static void run(int k, long n) {\n\
             volatile long sum = 0, left = 0;\n\
             for (volatile long i = 0; i < n; i++) {\n\
             if (!setjmp(jb)) sum += leaves[k](i); else left++;\n\
             }\n"
        }
    });
    s.push_str(
        "printf(\"leaf%d calls=%ld returns=%ld left=%ld sum=%ld\\n\", k, calls[k], returns[k], \
         (long)left, (long)sum);\n}\n\
         LINKAGE int serve(void) {\n\
         setvbuf(stdout, NULL, _IOLBF, 0);\n\
         printf(\"ready %d\\n\", (int)getpid());\n\
         char line[64];\n\
         while (fgets(line, sizeof line, stdin)) {\n\
         int k = -1; long n = 0;\n\
         if (sscanf(line, \"run %d %ld\", &k, &n) == 2 && k >= 0 && k < N) run(k, n);\n\
         else printf(\"bad command %s\", line);\n\
         printf(\"done %d\\n\", k);\n\
         }\n\
         printf(\"bye\\n\");\n\
         return 0;\n}\n",
    );
    s
}

/// A program built: the executable, and the file holding the leaves (the
/// executable, or the library it links).
pub(crate) struct Built {
    pub(crate) bin: PathBuf,
    pub(crate) code: PathBuf,
    /// The spec's module prefix of the leaves (`libleaves-c.so:`), or
    /// empty.
    pub(crate) module: String,
}

/// The program built (`-O1`, patchable entries) with a leaf per ordered
/// pair; `library`: its leaves in a shared library it links (not mapped
/// yet when a spawned program is stopped at its exec: probes on them
/// are pending until the loader maps it).
pub(crate) fn build(lang: Lang, library: bool) -> Built {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ledger-pairs");
    let (ext, tool, tag) = match lang {
        Lang::Throw => ("cc", "g++", "cc"),
        Lang::Longjmp => ("c", "gcc", "c"),
    };
    let code = source(lang, MECHS.len() * (MECHS.len() - 1));
    let flags = ["-O1", "-g", "-fpatchable-function-entry=5,0"];
    if !library {
        let src = format!("{code}int main(void) {{ return serve(); }}\n");
        let src = hotprobe_testkit::write_source(&dir, &format!("pairs.{ext}"), &src);
        let bin =
            hotprobe_testkit::compile(tool, &src, &dir.join(format!("pairs-{tag}")), &flags, &[]);
        return Built {
            code: bin.canonicalize().unwrap(),
            bin,
            module: String::new(),
        };
    }
    let lib_src = hotprobe_testkit::write_source(&dir, &format!("leaves.{ext}"), &code);
    let lib_name = format!("libleaves-{tag}.so");
    let mut lib_flags = flags.to_vec();
    lib_flags.extend(["-fPIC", "-shared"]);
    let lib = hotprobe_testkit::compile(tool, &lib_src, &dir.join(&lib_name), &lib_flags, &[]);
    // The program loads the library when told (`load`), then serves.
    let lib_path = lib.canonicalize().unwrap();
    let main = format!(
        "#include <dlfcn.h>\n#include <stdio.h>\n#include <string.h>\n\
         int main(void) {{\n\
         char line[64];\n\
         if (!fgets(line, sizeof line, stdin) || strcmp(line, \"load\\n\")) return 2;\n\
         void *h = dlopen(\"{}\", RTLD_NOW);\n\
         int (*serve)(void) = h ? (int (*)(void))dlsym(h, \"serve\") : 0;\n\
         return serve ? serve() : 3;\n}}\n",
        lib_path.display()
    );
    let main = hotprobe_testkit::write_source(&dir, &format!("pending.{ext}"), &main);
    let bin = hotprobe_testkit::compile(
        tool,
        &main,
        &dir.join(format!("pending-{tag}")),
        &["-O1"],
        // The C++ program does not link libgcc_s: only its library, opened
        // `RTLD_LOCAL`, brings it. The agent's interposed
        // `_Unwind_RaiseException` must find it there (it aborted the
        // program at its first throw when it looked only in the global
        // scope, `dlsym(RTLD_NEXT)`).
        &["-ldl"],
    );
    Built {
        bin,
        code: lib.canonicalize().unwrap(),
        module: format!("{lib_name}:"),
    }
}

/// The served program, its commands sent through stdin, its lines read
/// by a thread that raises `done` at each `done …` line.
pub(crate) struct Served {
    /// Started here (unprobed, or attached to), or `None`: spawned by a
    /// session.
    pub(crate) child: Option<Child>,
    pub(crate) stdin: Option<Box<dyn Write>>,
    pub(crate) lines: Receiver<String>,
    pub(crate) done: Arc<AtomicBool>,
    pub(crate) pid: i32,
}

impl Served {
    /// Started here, unprobed (`load`: told to load its library first).
    pub(crate) fn start(bin: &Path, load: bool) -> Served {
        let mut child = Command::new(bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = Box::new(child.stdin.take().unwrap());
        let out = child.stdout.take().unwrap();
        let mut served = Served::reading(out, stdin);
        served.child = Some(child);
        if load {
            served.send("load");
        }
        served.ready();
        served
    }

    /// Spawned by `s` (its `ready` line is read once `s` runs it).
    pub(crate) fn spawn(s: &mut Session, bin: &Path) -> (Served, TargetId) {
        let (in_r, in_w) = std::io::pipe().unwrap();
        let (out_r, out_w) = std::io::pipe().unwrap();
        let opts = SpawnOptions {
            stdin: Some(File::from(OwnedFd::from(in_r))),
            stdout: Some(File::from(OwnedFd::from(out_w))),
            ..Default::default()
        };
        let t = s.spawn_with(bin, &[], &opts).unwrap();
        drop(opts);
        (Served::reading(out_r, Box::new(in_w)), t)
    }

    pub(crate) fn reading(out: impl Read + Send + 'static, stdin: Box<dyn Write>) -> Served {
        let mut out = BufReader::new(out);
        let done = Arc::new(AtomicBool::new(false));
        let (tx, lines) = std::sync::mpsc::channel();
        let seen = done.clone();
        std::thread::spawn(move || loop {
            let mut l = String::new();
            if out.read_line(&mut l).unwrap_or(0) == 0 {
                return;
            }
            // `ready` too: a pending variant is served up to it.
            let is_done = l.starts_with("done ") || l.starts_with("ready ");
            if tx.send(l.trim_end().to_string()).is_err() {
                return;
            }
            if is_done {
                seen.store(true, Ordering::SeqCst);
            }
        });
        Served {
            child: None,
            stdin: Some(stdin),
            lines,
            done,
            pid: 0,
        }
    }

    /// Reads the `ready PID` line.
    pub(crate) fn ready(&mut self) {
        let ready = self.lines.recv_timeout(LIMIT).unwrap();
        self.pid = ready.strip_prefix("ready ").unwrap().parse().unwrap();
    }

    /// Closes its input and reads the rest: `bye` as it ends.
    pub(crate) fn finish(&mut self) -> Vec<String> {
        self.stdin = None;
        let mut rest = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(LIMIT) {
            rest.push(l);
        }
        rest
    }

    /// Sends `cmd` (its `done` not seen yet).
    pub(crate) fn send(&mut self, cmd: &str) {
        self.done.store(false, Ordering::SeqCst);
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
    }

    /// The lines of the command sent last, up to its `done` line.
    pub(crate) fn reply(&mut self) -> Vec<String> {
        let mut v = Vec::new();
        loop {
            match self.lines.recv_timeout(LIMIT) {
                Ok(l) => {
                    let done = l.starts_with("done ");
                    v.push(l);
                    if done {
                        return v;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!("no `done` line: {v:?}"),
                Err(RecvTimeoutError::Disconnected) => panic!("the program closed its output"),
            }
        }
    }

    /// Runs `cmd` unprobed (or with nothing to serve).
    pub(crate) fn run(&mut self, cmd: &str) -> Vec<String> {
        self.send(cmd);
        self.reply()
    }

    /// Its exit status once its output ended: 0 for a clean end.
    pub(crate) fn exit_code(&mut self) -> Option<i32> {
        match &mut self.child {
            Some(c) => c.wait().unwrap().code(),
            None => {
                // A child of this process the session spawned: reaped
                // here, the session being gone.
                let (_, status) = hotprobe_os::sys::waitpid(self.pid, 0).unwrap()?;
                (status & 0x7f == 0).then_some((status >> 8) & 0xff)
            }
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A probe placed: its id, what serves it, and the hits its handlers saw
/// (handler probes: pre, post).
pub(crate) struct Placed {
    pub(crate) id: ProbeId,
    /// The address it was placed at.
    pub(crate) addr: u64,
    pub(crate) mechanism: String,
    pub(crate) handled: Option<(Seen, Seen)>,
}

/// How many times a handler ran.
pub(crate) type Seen = Rc<Cell<u64>>;

/// Places `m` on `function` through the per-probe API.
pub(crate) fn place(
    s: &mut Session,
    t: TargetId,
    function: &str,
    m: Mech,
) -> Result<Placed, EngineError> {
    let (pre, post) = (Rc::new(Cell::new(0u64)), Rc::new(Cell::new(0u64)));
    let (pre_seen, post_seen) = (pre.clone(), post.clone());
    let on_pre = move |_: &mut hotprobe::HitContext<'_>| pre_seen.set(pre_seen.get() + 1);
    let on_post = move |_: &mut hotprobe::HitContext<'_>| post_seen.set(post_seen.get() + 1);
    let ret = format!("{function}%return");
    let (spec, action, choice) = match m {
        Mech::TrapEntry => (function, Action::Count, MechanismChoice::Trap),
        Mech::TrapReturn => (ret.as_str(), Action::Count, MechanismChoice::Trap),
        Mech::InProcess => (
            function,
            Action::Handler(Probe::new().pre(on_pre).post(on_post)),
            MechanismChoice::Auto,
        ),
        Mech::Patch => (function, Action::Count, MechanismChoice::Patch),
        Mech::Jump => (function, Action::Count, MechanismChoice::Jump),
        Mech::ShmHandler => (
            function,
            Action::Handler(Probe::new().pre(on_pre)),
            MechanismChoice::Auto,
        ),
    };
    let handler = matches!(action, Action::Handler(_));
    let added = s.add_using(t, spec, action, choice)?;
    let [p] = &added.placements[..] else {
        panic!(
            "{m:?} on {function}: {:?} placements",
            added.placements.len()
        );
    };
    Ok(Placed {
        id: p.id,
        addr: p.addr.0,
        mechanism: format!("{} / {}", p.mechanism, p.execution),
        handled: handler.then_some((pre, post)),
    })
}

/// Whether `m`, placed first on a function, went on the mechanism it
/// names (`mechanism`: "MECHANISM / EXECUTION").
pub(crate) fn placed_as_asked(m: Mech, mechanism: &str) -> bool {
    let on = |prefix: &str| mechanism.starts_with(prefix);
    match m {
        Mech::TrapEntry | Mech::TrapReturn => on("trap /"),
        Mech::InProcess => on("in-process trap /"),
        Mech::Patch => on("patch") && !mechanism.contains("handler"),
        Mech::Jump => on("jump /") && !mechanism.contains("handler"),
        Mech::ShmHandler => {
            (on("patch") || on("jump /")) && mechanism.contains("shared-memory handler")
        }
    }
}

/// One ordered pair on `leafK`.
pub(crate) struct Pair {
    pub(crate) first: Mech,
    pub(crate) second: Mech,
    pub(crate) function: String,
    /// The two probes (the second `None` where refused, with the reason).
    pub(crate) placed: Vec<(Mech, Placed)>,
    pub(crate) refused: Option<String>,
    /// What `leafK` did with the first probe alone (calls, returns,
    /// left), where it ran before the second was added.
    pub(crate) alone: (u64, u64, u64),
}

/// The `calls=`, `returns=` and `left=` numbers of a program's line.
pub(crate) fn program_counts(line: &str) -> (u64, u64, u64) {
    let n = |key: &str| -> u64 {
        let at = line
            .find(&format!(" {key}="))
            .unwrap_or_else(|| panic!("{line}"));
        line[at + key.len() + 2..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (n("calls"), n("returns"), n("left"))
}

/// What each probe of `pair` must show once its function ran: `first`
/// and `second` are the (calls, returns, left) made while each probe was
/// in place (the first's include the calls made before the second was
/// added). The failures found are added to `failures`.
pub(crate) fn check_counts(
    s: &Session,
    pair: &Pair,
    (first, second): ((u64, u64, u64), (u64, u64, u64)),
    failures: &mut Vec<String>,
) {
    for (i, (m, p)) in pair.placed.iter().enumerate() {
        let (calls, returns, left) = if i == 0 { first } else { second };
        let st = s.stats(p.id).unwrap_or_default();
        let want = match m {
            Mech::TrapReturn => ProbeStats {
                hits: calls,
                nmissed: 0,
                returns,
                abandoned: left,
            },
            _ => ProbeStats {
                hits: calls,
                ..ProbeStats::default()
            },
        };
        if st != want {
            failures.push(format!(
                "{}: {:?} then {:?}: {m:?} on {}: {st:?}, expected {want:?}",
                pair.function, pair.first, pair.second, p.mechanism
            ));
        }
        if let Some((pre, post)) = &p.handled {
            let want_post = if *m == Mech::InProcess { calls } else { 0 };
            if (pre.get(), post.get()) != (calls, want_post) {
                failures.push(format!(
                    "{}: {:?} then {:?}: {m:?} handlers ran (pre, post) = ({}, {}), expected \
                     ({calls}, {want_post})",
                    pair.function,
                    pair.first,
                    pair.second,
                    pre.get(),
                    post.get()
                ));
            }
        }
    }
}

/// The bytes of process `pid` at `addr` (/proc/PID/mem), if mapped.
pub(crate) fn memory_at(pid: i32, addr: u64, len: usize) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mem = File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut b = vec![0u8; len];
    mem.read_exact_at(&mut b, addr).ok().map(|_| b)
}

/// The file and offset behind `addr` of process `pid`, if a file maps it.
pub(crate) fn file_behind(pid: i32, addr: u64) -> Option<(PathBuf, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        let (s, e) = w.first()?.split_once('-')?;
        let (s, e) = (
            u64::from_str_radix(s, 16).ok()?,
            u64::from_str_radix(e, 16).ok()?,
        );
        let offset = u64::from_str_radix(w.get(2)?, 16).ok()?;
        let path = w.get(5).filter(|p| p.starts_with('/'))?;
        (s..e)
            .contains(&addr)
            .then(|| (PathBuf::from(path), addr - s + offset))
    })
}
