//! Code that makes its own system calls (issue 22). The agent keeps
//! `SIGTRAP` deliverable through the libc functions it interposes
//! (`sigprocmask`, `sigaction`, `sigaltstack`, `prctl`, `syscall()`…). A
//! `syscall` instruction outside libc and the dynamic loader — inline
//! assembly, a runtime of its own — changes the signal state unseen: the
//! process gets no in-process trap when any of its modules holds one
//! whose number may be a signal-state or thread call, or cannot be told.
//!
//! Each executable module mapped in the process (but libc, ld.so, the
//! vDSO and the agent) is decoded once with iced-x86 over its executable
//! sections (a linear sweep, cached per file for the tracer's life). A
//! `syscall` whose number is set by a `mov eax, imm` (or `mov rax, imm`)
//! in the instructions just before it, with nothing else writing `rax` in
//! between, and is none of [`UNSEEN`], is harmless; any other makes the
//! refusal.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hotprobe_x86::iced_x86::{
    Code, Decoder, DecoderOptions, Instruction, InstructionInfoFactory, OpAccess, Register,
};
use object::{Object, ObjectSection, SectionKind};

/// System calls that change what the agent relies on: the signal mask,
/// handlers, the alternate stack, the clock and seccomp, and threads
/// (`clone` without TLS shares the agent's per-thread block).
const UNSEEN: &[(u64, &str)] = &[
    (13, "rt_sigaction"),
    (14, "rt_sigprocmask"),
    (56, "clone"),
    (131, "sigaltstack"),
    (157, "prctl"),
    (317, "seccomp"),
    (435, "clone3"),
];

/// Instructions looked at before a `syscall` for its number.
const LOOK_BACK: usize = 8;

/// A module's `syscall` that makes the refusal: its address (section
/// address in the file) and what its number is.
#[derive(Clone, Debug)]
struct Finding {
    at: u64,
    what: String,
}

/// Scan results per module file (path, inode, size).
type Cache = HashMap<(PathBuf, u64, u64), Option<Finding>>;
static SCANNED: Mutex<Option<Cache>> = Mutex::new(None);

/// Why process `pid` may get no in-process trap (a module with its own
/// signal-state `syscall`), or None.
pub(super) fn refusal(pid: i32) -> Option<String> {
    let maps = std::fs::read_to_string(hotprobe_symbols::proc_dir(pid as u32).join("maps")).ok()?;
    let mut seen: Vec<&str> = Vec::new();
    for line in maps.lines() {
        let mut w = line.split_whitespace();
        let (Some(perms), Some(_off), Some(_dev), Some(inode)) =
            (w.nth(1), w.next(), w.next(), w.next())
        else {
            continue;
        };
        let Some(path) = w.next() else { continue };
        if !perms.contains('x') || inode == "0" || !path.starts_with('/') || seen.contains(&path) {
            continue;
        }
        seen.push(path);
        if is_exempt(path) {
            continue;
        }
        // The file as mapped (a binary replaced on disk since is read
        // from the mapping's own inode).
        let file = map_file(pid, line).unwrap_or_else(|| PathBuf::from(path));
        if let Some(f) = scan_cached(&file, path) {
            return Some(format!(
                "{} has a `syscall` instruction of its own at {:#x} ({}): signal masks, \
                 handlers and threads it sets up are unseen by the agent, which keeps \
                 SIGTRAP deliverable through libc's calls only",
                Path::new(path)
                    .file_name()
                    .map_or(path.into(), |n| n.to_string_lossy()),
                f.at,
                f.what
            ));
        }
    }
    None
}

/// libc, the dynamic loader, the agent: their system calls are the
/// libc functions the agent interposes, or its own.
fn is_exempt(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("libc.so")
        || name.starts_with("libc-")
        || name.starts_with("ld-linux")
        || name.starts_with("ld-")
        || name.contains("libhotprobe_agent")
        || path.contains("memfd:")
}

/// `/proc/PID/map_files/START-END` of a maps line.
fn map_file(pid: i32, line: &str) -> Option<PathBuf> {
    let range = line.split_whitespace().next()?;
    let p = PathBuf::from(format!("/proc/{pid}/map_files/{range}"));
    p.exists().then_some(p)
}

fn scan_cached(file: &Path, path: &str) -> Option<Finding> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(file).ok()?;
    let key = (PathBuf::from(path), meta.ino(), meta.size());
    if let Some(hit) = SCANNED
        .lock()
        .ok()
        .and_then(|c| c.as_ref().and_then(|c| c.get(&key).cloned()))
    {
        return hit;
    }
    let found = std::fs::read(file).ok().and_then(|b| scan(&b));
    if let Ok(mut c) = SCANNED.lock() {
        c.get_or_insert_with(HashMap::new)
            .insert(key, found.clone());
    }
    found
}

/// The first `syscall` of ELF image `bytes` that is not known harmless.
fn scan(bytes: &[u8]) -> Option<Finding> {
    let obj = object::File::parse(bytes).ok()?;
    let mut info = InstructionInfoFactory::new();
    for sec in obj.sections() {
        if sec.kind() != SectionKind::Text {
            continue;
        }
        let Ok(data) = sec.data() else { continue };
        let mut dec = Decoder::with_ip(64, data, sec.address(), DecoderOptions::NONE);
        let mut recent: Vec<Instruction> = Vec::with_capacity(LOOK_BACK + 1);
        let mut ins = Instruction::default();
        while dec.can_decode() {
            dec.decode_out(&mut ins);
            if ins.code() == Code::Syscall {
                if let Err(what) = number_of(&recent, &mut info) {
                    return Some(Finding { at: ins.ip(), what });
                }
            }
            if recent.len() == LOOK_BACK {
                recent.remove(0);
            }
            recent.push(ins);
        }
    }
    None
}

/// The system call number set just before a `syscall` (`recent`: the
/// instructions before it, oldest first): Ok when it is known and not
/// one of [`UNSEEN`], else what it is.
fn number_of(recent: &[Instruction], info: &mut InstructionInfoFactory) -> Result<u64, String> {
    for i in recent.iter().rev() {
        let writes_rax = info.info(i).used_registers().iter().any(|u| {
            u.register().full_register() == Register::RAX
                && matches!(
                    u.access(),
                    OpAccess::Write
                        | OpAccess::CondWrite
                        | OpAccess::ReadWrite
                        | OpAccess::ReadCondWrite
                )
        });
        if !writes_rax {
            // A branch between them: the number may come from elsewhere.
            if i.flow_control() != hotprobe_x86::iced_x86::FlowControl::Next {
                break;
            }
            continue;
        }
        let n = match i.code() {
            Code::Mov_r32_imm32
            | Code::Mov_r64_imm64
            | Code::Mov_rm64_imm32
            | Code::Mov_rm32_imm32
                if i.op0_register().full_register() == Register::RAX =>
            {
                i.immediate(1)
            }
            _ => break,
        };
        return match UNSEEN.iter().find(|(k, _)| *k == n) {
            Some((_, name)) => Err(name.to_string()),
            None => Ok(n),
        };
    }
    Err("its number is not set just before it".into())
}
