//! Leaving a process we attached to as found (issue 23): at detach, once
//! every written byte is back, the agent we injected takes back what it
//! set up (`hotprobe_agent_release`: hooked return addresses, its
//! `SIGTRAP` handler, hang-up pipe and thread-exit key, its shared
//! memories, shadow stacks and near page), the library is `dlclose`d, and
//! our stub and trampoline pages are unmapped, with every thread stopped,
//! by code that brings its thread back even if we die meanwhile (see
//! [`call_release`]). Nothing goes while a thread can still run in it
//! or return into it: a thread whose PC stays in hotprobe's code, or one
//! inside the agent or a stub (a signal handler or a libc call of the
//! agent's on top of it), keeps everything mapped, and the reason is
//! reported ([`FastPath::take_left_behind`]). An agent preloaded at spawn
//! is not unloaded (the program started with it).

use std::time::Duration;

use hotprobe_process::remote_call::remote_syscall;
use hotprobe_process::ProcessTarget;
use hotprobe_target::{RuntimeAddr, Target};

use crate::FastPath;

/// What unloading an injected agent needs: addresses in the target.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Unload {
    /// `hotprobe_agent_release`.
    pub(crate) release: u64,
    /// libc's `dlclose` and the handle of our `dlopen` (none when the agent
    /// was there before us: it is released, and stays loaded, dormant).
    pub(crate) dlclose: Option<(u64, u64)>,
}

/// How long a remote call of the unload may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times the threads run on briefly to leave hotprobe's code.
const LEAVE_TRIES: usize = 50;

impl FastPath {
    /// What was left in the target at detach, and why (empty when nothing
    /// of hotprobe's stayed mapped, or the agent was preloaded). Known
    /// once the target is detached: the unload runs last (see
    /// [`FastPath::unload_agent`]).
    pub fn take_left_behind(&mut self) -> Vec<String> {
        self.left_behind
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }

    /// Has the injected agent unloaded and our pages unmapped (see the
    /// module docs) at the target's detach, after the engine's last
    /// breakpoint is out: a breakpoint may lie in the agent or in a
    /// library it brought (the engine hooks libgcc's unwinder for return
    /// probes), which the `dlclose` unmaps.
    pub(crate) fn unload_agent(&mut self, t: &mut ProcessTarget) {
        let Some(unload) = self.unload.take() else {
            return;
        };
        let pools: Vec<(u64, u64, u64)> = std::mem::take(&mut self.pools)
            .into_iter()
            .map(|p| (p.start, p.next, p.end))
            .collect();
        self.page_cache = None;
        let near = self
            .shm()
            .header()
            .near_page
            .load(std::sync::atomic::Ordering::Relaxed);
        let left = self.left_behind.clone();
        t.on_detach(move |t| {
            let notes = unload_now(t, unload, &pools, near);
            if let Ok(mut l) = left.lock() {
                l.extend(notes);
            }
        });
    }
}

/// The unload itself (see the module docs), with every thread stopped;
/// what stays, and why.
fn unload_now(
    t: &mut ProcessTarget,
    unload: Unload,
    pools: &[(u64, u64, u64)],
    near: u64,
) -> Vec<String> {
    let mut left = Vec::new();
    let pid = t.pid();
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", t.live_task())).unwrap_or_default();
    let mut code: Vec<(u64, u64)> = hotprobe_process::parse_maps_lines(&maps)
        .into_iter()
        .filter(|m| m.exec && m.name.contains("libhotprobe_agent"))
        .map(|m| (m.start, m.end))
        .collect();
    code.extend(pools.iter().map(|p| (p.0, p.2)));
    if near != 0 {
        code.push((near, near + 4096));
    }
    if let Some((tid, rip)) = leave_code(t, &code) {
        left.push(format!(
            "the agent and its pages stay mapped in pid {pid}: thread {tid} stays at {rip:#x} \
             in hotprobe's code"
        ));
        return left;
    }
    match call_release(t, unload, pools) {
        Ok(Released { release, dlclose }) => {
            if release == -RELEASE_BUSY {
                left.push(format!(
                    "the agent and its pages stay mapped in pid {pid}: a thread is inside the \
                     agent or a stub (a signal handler or a call on top of it)"
                ));
            } else if release > 0 {
                left.push(format!(
                    "{release} shared-memory mappings stay in pid {pid} (past the agent's table)"
                ));
            }
            match dlclose {
                Some(0) => {}
                Some(r) => left.push(format!(
                    "the agent stays loaded, dormant, in pid {pid}: dlclose returned {r}"
                )),
                None if release >= 0 && unload.dlclose.is_none() => left.push(format!(
                    "the agent stays loaded, dormant, in pid {pid}: it was there before us"
                )),
                None => {}
            }
        }
        Err(e) => left.push(format!(
            "the agent stays in pid {pid}: its release failed: {e}"
        )),
    }
    left
}

/// What the release code found: `hotprobe_agent_release`'s result, and
/// `dlclose`'s if it was called.
struct Released {
    release: i32,
    dlclose: Option<i32>,
}

/// Most stub pages the release code hands the agent; more are unmapped by
/// remote system calls after it.
const MAX_PAGES: usize = 250;
/// Pause iterations the release code waits for the tracer before it
/// restores the thread itself (a tracer killed meanwhile): well over the
/// tracer's 200 µs polling, well under a second.
const SPIN: u64 = 1 << 22;

/// Runs `hotprobe_agent_release` (with our pages) then `dlclose` in the
/// target by code written there that returns the thread to where it was
/// even if we die meanwhile (`remote_call_resumable`). The code and its
/// constants go in the free room of one of our pages, which the agent
/// does not unmap (we do, last), so that no remote system call, which a
/// tracer killed in its midst would leave half done, comes before it; its
/// results go on the thread's stack, below the red zone.
fn call_release(
    t: &mut ProcessTarget,
    unload: Unload,
    pools: &[(u64, u64, u64)],
) -> Result<Released, String> {
    use hotprobe_process::remote_resumable::{
        remote_call_resumable, resumable_stack, resumable_thread_registers, resume_context,
    };
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let regs = resumable_thread_registers(t).map_err(|x| e(&x))?;
    let resume = resume_context(&regs);
    let data = resumable_stack(&regs);
    let others = |host: Option<usize>| -> Vec<(u64, u64)> {
        pools
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != host)
            .map(|(_, p)| (p.0, p.2))
            .collect()
    };
    // A page of ours with room for the code and the page list.
    let room = CODE_ROOM + 16 * pools.len().min(MAX_PAGES) as u64;
    let host = pools.iter().position(|p| p.2 - p.1 >= room);
    let (base, mapped) = match host {
        Some(i) => (((pools[i].1 + 63) & !63), None),
        None => {
            let m = remote_syscall(
                t,
                libc::SYS_mmap as u64,
                &[
                    0,
                    4096,
                    (libc::PROT_READ | libc::PROT_EXEC) as u64,
                    (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
                    u64::MAX,
                    0,
                ],
            )
            .map_err(|x| e(&x))?;
            if (m as i64) < 0 {
                return Err(format!("remote mmap: errno {}", -(m as i64)));
            }
            (m, Some(m))
        }
    };
    let given_all = others(host);
    let (given, rest) = given_all.split_at(given_all.len().min(MAX_PAGES));
    let r = (|| -> Result<Released, String> {
        let list = base + CODE_ROOM;
        let code = release_code(base, data, list, unload, given.len() as u64, &resume)
            .map_err(|x| e(&x))?;
        if code.len() as u64 > CODE_ROOM {
            return Err(format!("release code of {} bytes", code.len()));
        }
        let mut page_list = Vec::with_capacity(given.len() * 16);
        for (s, end) in given {
            page_list.extend_from_slice(&s.to_le_bytes());
            page_list.extend_from_slice(&end.to_le_bytes());
        }
        t.write_memory(RuntimeAddr(list), &page_list)
            .map_err(|x| e(&x))?;
        t.write_memory(RuntimeAddr(data), &[0u8; DATA_LEN])
            .map_err(|x| e(&x))?;
        t.write_memory(RuntimeAddr(base), &code)
            .map_err(|x| e(&x))?;
        remote_call_resumable(
            t,
            base,
            (base, base + room),
            data + DATA_DONE,
            Some(data + DATA_RELEASED),
            CALL_TIMEOUT,
        )
        .map_err(|x| e(&x))?;
        let mut w = [0u8; 16];
        t.read_memory(RuntimeAddr(data), &mut w)
            .map_err(|x| e(&x))?;
        let release = i64::from_le_bytes(w[..8].try_into().unwrap_or_default()) as i32;
        let dl = u64::from_le_bytes(w[8..].try_into().unwrap_or_default());
        Ok(Released {
            release,
            // The code stores dlclose's result + 1 (0: not called).
            dlclose: (dl != 0).then(|| dl.wrapping_sub(1) as i32),
        })
    })();
    // The thread is out of the code (restored, or gone on alone): the
    // page that held it goes last (the agent unmapped the others).
    let released = matches!(&r, Ok(rel) if rel.release >= 0);
    if let Some(m) = mapped {
        let _ = remote_syscall(t, libc::SYS_munmap as u64, &[m, 4096]);
    }
    if released {
        let last = host.map(|i| (pools[i].0, pools[i].2));
        for &(start, end) in rest.iter().chain(last.iter()) {
            let _ = remote_syscall(t, libc::SYS_munmap as u64, &[start, end - start]);
        }
    }
    r
}

/// Room for the release code and its constants (under 400 bytes).
const CODE_ROOM: u64 = 512;
/// Offsets in the results (on the thread's stack): `hotprobe_agent_release`'s
/// result at 0, dlclose's (+ 1) at 8, the done word, and a word set once
/// the release returned, before `dlclose`: from then on nothing of the
/// agent's runs in the other threads, which may run while `dlclose` waits
/// for a lock one of them holds (`hotprobe_process`'s `lend.rs`).
const DATA_DONE: u64 = 16;
const DATA_RELEASED: u64 = 24;
const DATA_LEN: usize = 32;

/// The release code at `base` (see [`call_release`]), its results at
/// `data`: calls the release with the page list at `list`, then (unless it refused)
/// `dlclose`, stores the results, sets the done word, spins [`SPIN`]
/// times, then restores `resume` (every general register, the flags
/// through the stack below the red zone) and jumps to its `rip`.
fn release_code(
    base: u64,
    data: u64,
    list: u64,
    unload: Unload,
    n_pages: u64,
    resume: &hotprobe_target::Registers,
) -> Result<Vec<u8>, iced_x86::IcedError> {
    use iced_x86::code_asm::*;
    let mut a = CodeAssembler::new(64)?;
    let mut release_fn = a.create_label();
    let mut dlclose_fn = a.create_label();
    let mut handle = a.create_label();
    let mut skip = a.create_label();
    let mut spin = a.create_label();
    // One label per saved word: rax … r15, rsp, rflags, rip.
    let mut saved: Vec<CodeLabel> = (0..18).map(|_| a.create_label()).collect();
    a.mov(rdi, list)?;
    a.mov(rsi, n_pages)?;
    a.call(qword_ptr(release_fn))?;
    a.mov(rcx, data)?;
    a.movsxd(rax, eax)?;
    a.mov(qword_ptr(rcx), rax)?;
    a.test(eax, eax)?;
    a.js(skip)?;
    a.mov(qword_ptr(rcx + DATA_RELEASED as i32), 1i32)?;
    a.mov(rax, qword_ptr(dlclose_fn))?;
    a.test(rax, rax)?;
    a.jz(skip)?;
    a.mov(rdi, qword_ptr(handle))?;
    a.call(rax)?;
    a.mov(rcx, data)?;
    a.mov(eax, eax)?;
    a.inc(rax)?;
    a.mov(qword_ptr(rcx + 8), rax)?;
    a.set_label(&mut skip)?;
    a.mov(rcx, data)?;
    a.mov(qword_ptr(rcx + DATA_DONE as i32), 1i32)?;
    a.mov(rdx, SPIN)?;
    a.set_label(&mut spin)?;
    a.pause()?;
    a.dec(rdx)?;
    a.jnz(spin)?;
    // The thread's own registers back: it goes on where it was.
    let order = [
        rax, rbx, rcx, rdx, rsi, rdi, rbp, r8, r9, r10, r11, r12, r13, r14, r15,
    ];
    for (r, l) in order.iter().zip(&saved) {
        a.mov(*r, qword_ptr(*l))?;
    }
    a.mov(rsp, qword_ptr(saved[15]))?;
    a.lea(rsp, qword_ptr(rsp - 128))?;
    a.push(qword_ptr(saved[16]))?;
    a.popfq()?;
    a.lea(rsp, qword_ptr(rsp + 128))?;
    a.jmp(qword_ptr(saved[17]))?;
    a.set_label(&mut release_fn)?;
    a.dq(&[unload.release])?;
    a.set_label(&mut dlclose_fn)?;
    a.dq(&[unload.dlclose.map_or(0, |d| d.0)])?;
    a.set_label(&mut handle)?;
    a.dq(&[unload.dlclose.map_or(0, |d| d.1)])?;
    let r = resume;
    let words = [
        r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.r8, r.r9, r.r10, r.r11, r.r12, r.r13,
        r.r14, r.r15, r.rsp, r.rflags, r.rip,
    ];
    for (l, w) in saved.iter_mut().zip(words) {
        a.set_label(l)?;
        a.dq(&[w])?;
    }
    a.assemble(base)
}

/// `hotprobe_agent_release`'s "busy" code (the agent's `RELEASE_BUSY`).
const RELEASE_BUSY: i32 = 1;

/// Runs the threads on briefly until none has its PC in `code` (address
/// ranges); the thread and PC still there after [`LEAVE_TRIES`], if any.
fn leave_code(t: &mut ProcessTarget, code: &[(u64, u64)]) -> Option<(u64, u64)> {
    let inside = |t: &mut ProcessTarget| {
        t.threads().into_iter().find_map(|th| {
            let rip = t.registers(th).ok()?.rip;
            code.iter()
                .any(|&(s, e)| rip >= s && rip < e)
                .then_some((th.0, rip))
        })
    };
    for _ in 0..LEAVE_TRIES {
        let last = inside(t)?;
        if t.resume_all().is_err() {
            return Some(last);
        }
        std::thread::yield_now();
        if t.stop_all().is_err() {
            return Some(last);
        }
    }
    inside(t)
}
