//! A scripted [`Os`]: each call the target makes must be the next line of
//! a script, in the format of [`Sys`](super::Sys)'s call log (`call args =
//! result`, `#` starts a comment), and gets that line's result. A call out
//! of order, or past the end, panics with the script line expected; a test
//! then checks [`FakeOs::remaining`] is empty. A recorded log replays as a
//! script as it is. One call is optional: a drain look (`ready FLAGS`,
//! [`Os::waitpid_ready`]) the script does not name at that point finds
//! nothing.

use super::{Os, SigInfo, Waited};
use crate::sys::SysError;
use std::collections::VecDeque;
use std::fs::File;
use std::sync::Mutex;
use std::time::Duration;

/// One line of a script: where it was, the call, the result.
#[derive(Debug, Clone)]
struct Line {
    number: usize,
    call: String,
    result: String,
}

/// A scripted OS layer (see the module docs).
#[derive(Debug)]
pub struct FakeOs {
    script: Mutex<VecDeque<Line>>,
    made: Mutex<Vec<String>>,
}

impl FakeOs {
    /// The fake answering `script` (comments and blank lines skipped).
    pub fn new(script: &str) -> Self {
        let lines = script
            .lines()
            .enumerate()
            .filter_map(|(i, l)| {
                let l = l.trim();
                if l.is_empty() || l.starts_with('#') {
                    return None;
                }
                let (call, result) = l
                    .split_once(" = ")
                    .unwrap_or_else(|| panic!("script line {}: no ` = ` in {l:?}", i + 1));
                Some(Line {
                    number: i + 1,
                    call: call.trim().to_string(),
                    result: result.trim().to_string(),
                })
            })
            .collect();
        FakeOs {
            script: Mutex::new(lines),
            made: Mutex::new(Vec::new()),
        }
    }

    /// The calls made so far, as script lines' left sides.
    pub fn made(&self) -> Vec<String> {
        self.made.lock().expect("fake lock").clone()
    }

    /// The script lines not reached yet.
    pub fn remaining(&self) -> Vec<String> {
        self.script
            .lock()
            .expect("fake lock")
            .iter()
            .map(|l| format!("line {}: {} = {}", l.number, l.call, l.result))
            .collect()
    }

    /// The result of `call`, which must be the script's next line.
    fn answer(&self, call: String) -> String {
        if std::thread::panicking() {
            // A failed test dropping its target: no second panic.
            return format!("err {}", libc::ESRCH);
        }
        self.made.lock().expect("fake lock").push(call.clone());
        let next = self.script.lock().expect("fake lock").pop_front();
        match next {
            Some(l) if l.call == call => l.result,
            Some(l) => panic!(
                "scripted OS: the target called `{call}`, script line {} expects `{}`",
                l.number, l.call
            ),
            None => panic!("scripted OS: the target called `{call}` past the script's end"),
        }
    }
}

fn err(call: &'static str, pid: i32, errno: i32) -> SysError {
    SysError {
        call,
        pid,
        source: std::io::Error::from_raw_os_error(errno),
    }
}

/// Parses `ok` / `err N` / a value (with `value`).
fn parse<T>(
    call: &'static str,
    pid: i32,
    r: &str,
    value: impl FnOnce(&str) -> Option<T>,
) -> Result<T, SysError> {
    if let Some(n) = r.strip_prefix("err ") {
        let errno = n
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("bad errno {n:?}"));
        return Err(err(call, pid, errno));
    }
    Ok(value(r).unwrap_or_else(|| panic!("scripted OS: bad result {r:?} for {call}")))
}

fn int(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn hex_words<const N: usize>(s: &str) -> Option<[u64; N]> {
    let v: Vec<u64> = s
        .split(',')
        .map(|w| u64::from_str_radix(w, 16).ok())
        .collect::<Option<_>>()?;
    v.try_into().ok()
}

fn unit(s: &str) -> Option<()> {
    (s == "ok").then_some(())
}

fn waited(call: &'static str, pid: i32, r: &str) -> Waited {
    parse(call, pid, r, |s| {
        if s == "none" {
            return Some(None);
        }
        let (p, st) = s.split_once(' ')?;
        Some(Some((p.parse().ok()?, int(st)? as i32)))
    })
}

impl Os for FakeOs {
    fn seize(&self, pid: i32, options: i32) -> Result<(), SysError> {
        let r = self.answer(format!("seize {pid} {options:#x}"));
        parse("seize", pid, &r, unit)
    }
    fn interrupt(&self, pid: i32) -> Result<(), SysError> {
        let r = self.answer(format!("interrupt {pid}"));
        parse("interrupt", pid, &r, unit)
    }
    fn cont(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        let r = self.answer(format!("cont {pid} {sig}"));
        parse("cont", pid, &r, unit)
    }
    fn step(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        let r = self.answer(format!("step {pid} {sig}"));
        parse("step", pid, &r, unit)
    }
    fn syscall_resume(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        let r = self.answer(format!("syscall {pid} {sig}"));
        parse("syscall", pid, &r, unit)
    }
    fn listen(&self, pid: i32) -> Result<(), SysError> {
        let r = self.answer(format!("listen {pid}"));
        parse("listen", pid, &r, unit)
    }
    fn detach(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        let r = self.answer(format!("detach {pid} {sig}"));
        parse("detach", pid, &r, unit)
    }
    fn geteventmsg(&self, pid: i32) -> Result<u64, SysError> {
        let r = self.answer(format!("geteventmsg {pid}"));
        parse("geteventmsg", pid, &r, int)
    }
    fn getsiginfo(&self, pid: i32) -> Result<SigInfo, SysError> {
        let r = self.answer(format!("getsiginfo {pid}"));
        parse("getsiginfo", pid, &r, |s| {
            let (signo, code) = s.split_once(' ')?;
            Some(SigInfo {
                signo: signo.parse().ok()?,
                code: code.parse().ok()?,
            })
        })
    }
    fn getregs(&self, pid: i32) -> Result<libc::user_regs_struct, SysError> {
        let r = self.answer(format!("getregs {pid}"));
        parse("getregs", pid, &r, |s| {
            hex_words::<27>(s).map(|w| super::regs_from_words(&w))
        })
    }
    fn setregs(&self, pid: i32, regs: &libc::user_regs_struct) -> Result<(), SysError> {
        let words = super::words(&super::regs_words(regs));
        let r = self.answer(format!("setregs {pid} {words}"));
        parse("setregs", pid, &r, unit)
    }
    fn getxmm(&self, pid: i32) -> Result<[u64; 16], SysError> {
        let r = self.answer(format!("getxmm {pid}"));
        parse("getxmm", pid, &r, hex_words::<16>)
    }
    fn get_debugreg(&self, pid: i32, n: usize) -> Result<u64, SysError> {
        let r = self.answer(format!("get_debugreg {pid} {n}"));
        parse("get_debugreg", pid, &r, int)
    }
    fn set_debugreg(&self, pid: i32, n: usize, value: u64) -> Result<(), SysError> {
        let r = self.answer(format!("set_debugreg {pid} {n} {value:#x}"));
        parse("set_debugreg", pid, &r, unit)
    }
    fn waitpid(&self, pid: i32, flags: i32) -> Waited {
        let r = self.answer(format!("waitpid {pid} {flags:#x}"));
        waited("waitpid", pid, &r)
    }
    fn waitpid_timeout(&self, pid: i32, flags: i32, _d: Duration) -> Option<Waited> {
        let r = self.answer(format!("waitpid_timeout {pid} {flags:#x}"));
        (r != "unavailable").then(|| waited("waitpid_timeout", pid, &r))
    }
    fn waitpid_ready(&self, flags: i32) -> Waited {
        // A drain look the script does not name finds nothing: scripts
        // written before the drain (and the fixtures recorded then) name
        // none.
        let call = format!("ready {flags:#x}");
        let scripted = self
            .script
            .lock()
            .expect("fake lock")
            .front()
            .is_some_and(|l| l.call == call);
        if !scripted {
            return Ok(None);
        }
        let r = self.answer(call);
        waited("ready", -1, &r)
    }
    fn tgkill(&self, tgid: i32, tid: i32, sig: i32) -> Result<(), SysError> {
        let r = self.answer(format!("tgkill {tgid} {tid} {sig}"));
        parse("tgkill", tid, &r, unit)
    }
    fn kill(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        let r = self.answer(format!("kill {pid} {sig}"));
        parse("kill", pid, &r, unit)
    }
    fn task_state(&self, pid: i32, tid: i32) -> Option<char> {
        let r = self.answer(format!("task_state {pid} {tid}"));
        match r.as_str() {
            "gone" => None,
            s => s.chars().next(),
        }
    }
    fn open_mem(&self, pid: i32) -> Result<File, SysError> {
        let r = self.answer(format!("open_mem {pid}"));
        parse("open_mem", pid, &r, unit)?;
        // Any file will do: nothing reads a fake process's memory.
        File::open("/dev/null").map_err(|e| SysError {
            call: "open(/dev/null)",
            pid,
            source: e,
        })
    }
}
