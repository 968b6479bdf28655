//! The in-process trap mechanism (tracer side): an `int3` at any
//! instruction boundary, taken by the agent's own `SIGTRAP` handler inside
//! the target (no ptrace stop once the tracer stops tracing, see
//! `hotprobe::Session`), for sites where neither a patch nor a jump fits
//! (a function shorter than 5 bytes, a jump target, an instruction in the
//! middle of a function). The agent's side is `hotprobe-agent`'s `inproc`
//! module; the table is [`hotprobe_abi::InprocSite`].
//!
//! How the displaced instruction runs, decided here from
//! [`hotprobe_x86::plan_probe`]'s plan:
//! * `ret` and `call rel32` are emulated by the handler (a copy of a
//!   `call` would push the copy's address);
//! * every other instruction the trap mechanism can boost or emulate is
//!   *boosted*: re-encoded by iced-x86's `BlockEncoder` (as the jump
//!   mechanism's trampolines are: RIP-relative operands and relative
//!   branches keep their absolute targets) into the fast path's pages
//!   within ±2 GiB, followed by a `jmp` back to the next instruction;
//! * refused (the site stays on the ptrace trap, with this reason):
//!   instructions the trap mechanism must single-step (an indirect `call`,
//!   which would push the copy's address; `ret imm16`), and what
//!   `plan_probe` refuses (`int3`, `ud2`, privileged instructions…);
//!   every site of a process with a `syscall` instruction of its own that
//!   may change its signal state unseen (`raw_syscalls`).
//!
//! Detach writes the original byte back and stops counting; the table
//! entry and the copy stay, so a thread whose `SIGTRAP` is still pending,
//! or that is inside the copy, finishes correctly (the fast path's pages
//! are never unmapped).

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use hotprobe_abi::{
    HANDLER_BUSY, HANDLER_DONE, HANDLER_MODIFIED, HANDLER_POST, HANDLER_REQUEST, HANDLER_SLEEPING,
    HANDLER_STUB, INPROC_BOOST, INPROC_CALL, INPROC_COUNT, INPROC_EXIT, INPROC_HANDLER,
    INPROC_KIND_MASK, INPROC_POST, INPROC_POST_SITE, INPROC_RECORD, INPROC_RET,
};
use hotprobe_process::ProcessTarget;
use hotprobe_target::Registers;
use hotprobe_target::{RuntimeAddr, Target};
use hotprobe_x86::iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, FlowControl, Instruction, InstructionBlock,
};
use hotprobe_x86::{plan_probe, Emulation, Execution};

use crate::foreign::take_own_bytes_out;
use crate::{FastPath, FastPathError, ForeignWrite, Installed};

mod raw_syscalls;

/// What [`FastPath::add_inproc`] placed.
#[derive(Clone, Debug)]
pub struct InprocInfo {
    /// The fast-path probe id (counter index).
    pub probe_id: u32,
    /// The site.
    pub addr: u64,
    /// How the displaced instruction runs: `boosted`, `emulated`.
    pub execution: &'static str,
    /// The instruction, as text.
    pub instruction: String,
}

/// How a site's instruction runs in the handler, and the bytes of its copy.
enum Plan {
    Boost(Instruction),
    Ret,
    Call { target: u64, next: u64 },
}

/// Decides how the instruction at `addr` (bytes `code`) runs in-process,
/// or why it cannot.
fn plan_site(code: &[u8], addr: u64) -> Result<(Plan, String), String> {
    // The slot address only matters for the reach of RIP-relative operands:
    // the copy goes within ±2 GiB of the site, checked when it is encoded.
    let p = plan_probe(code, addr, addr).map_err(|e| e.to_string())?;
    let text = p.mnemonic.clone();
    let plan = match p.execution {
        Execution::Emulate(Emulation::Ret { pop_extra: 0 }) => Plan::Ret,
        Execution::Emulate(Emulation::Ret { .. }) => {
            return Err(format!("{text}: `ret imm16` is not emulated in-process"))
        }
        Execution::Emulate(Emulation::CallRel {
            target,
            return_addr,
        }) => Plan::Call {
            target,
            next: return_addr,
        },
        Execution::Emulate(_) | Execution::Boost => Plan::Boost(p.instruction),
        Execution::Step(_) => {
            return Err(format!(
                "{text} must be single-stepped (its copy would push or see the copy's address)"
            ))
        }
    };
    Ok((plan, text))
}

/// `instr` (not a branch) re-encoded to run at `at`, alone.
fn relocate_alone(instr: Instruction, at: u64) -> Result<Vec<u8>, String> {
    let instrs = [instr];
    let block = InstructionBlock::new(&instrs, at);
    BlockEncoder::encode(64, block, BlockEncoderOptions::NONE)
        .map(|r| r.code_buffer)
        .map_err(|e| e.to_string())
}

/// `instr` re-encoded to run at `at`, followed by a `jmp` back to `back`.
fn relocate(instr: Instruction, at: u64, back: u64) -> Result<Vec<u8>, String> {
    let mut jmp = Instruction::with_branch(Code::Jmp_rel32_64, back).map_err(|e| e.to_string())?;
    // An address no branch targets: BlockEncoder re-targets branches to
    // instructions of the block, and `back` must stay the original address.
    jmp.set_ip(0);
    let instrs = [instr, jmp];
    let block = InstructionBlock::new(&instrs, at);
    BlockEncoder::encode(64, block, BlockEncoderOptions::NONE)
        .map(|r| r.code_buffer)
        .map_err(|e| e.to_string())
}

impl FastPath {
    /// Whether the instruction at `addr` of the stopped target can take an
    /// in-process trap: `Ok(instruction text)`, or why not.
    pub fn inproc_check(&mut self, t: &mut ProcessTarget, addr: u64) -> Result<String, String> {
        let mut code = [0u8; 16];
        read_code(t, addr, &mut code).map_err(|e| e.to_string())?;
        plan_site(&code, addr).map(|(_, text)| text)
    }

    /// Places an in-process trap counting hits at `addr` (an instruction
    /// boundary the caller checked): builds the copy, publishes the site,
    /// writes the `int3` with every thread stopped (left stopped).
    pub fn add_inproc(
        &mut self,
        t: &mut ProcessTarget,
        addr: u64,
    ) -> Result<InprocInfo, FastPathError> {
        self.place_inproc(t, addr, 0)
    }

    /// As [`FastPath::add_inproc`], and each hit also calls the tracer's
    /// handler through shared memory before the displaced instruction
    /// runs (see [`FastPath::take_handler_call`]).
    ///
    /// With `post`, the probe's post handler is called too, after the
    /// displaced instruction ran: for an emulated one (`ret`, `call`) in
    /// the same signal; for a boosted one at an `int3` placed right after
    /// its copy (a second hand-over, [`hotprobe_abi::INPROC_POST_SITE`]).
    /// Refused for a boosted branch (a taken one would leave the copy
    /// before that `int3`: it needs a single-step).
    pub fn add_inproc_handler(
        &mut self,
        t: &mut ProcessTarget,
        addr: u64,
        post: bool,
    ) -> Result<InprocInfo, FastPathError> {
        self.place_inproc(t, addr, INPROC_HANDLER | if post { INPROC_POST } else { 0 })
    }

    /// As [`FastPath::add_inproc`], and each hit also writes an event (the
    /// argument registers) into its thread's ring: with `exit` (the site
    /// is a function's first instruction) an entry event, the return
    /// hooked too and recording an exit event, as a recording patch or
    /// jump does; without, a hit event (`KIND_HIT`).
    pub fn add_inproc_record(
        &mut self,
        t: &mut ProcessTarget,
        addr: u64,
        exit: bool,
    ) -> Result<InprocInfo, FastPathError> {
        self.place_inproc(t, addr, INPROC_RECORD | if exit { INPROC_EXIT } else { 0 })
    }

    fn place_inproc(
        &mut self,
        t: &mut ProcessTarget,
        addr: u64,
        extra: u32,
    ) -> Result<InprocInfo, FastPathError> {
        let mut code = [0u8; 16];
        read_code(t, addr, &mut code)?;
        let impossible = |why: String| FastPathError::Impossible {
            function: format!("{addr:#x}"),
            mechanism: "in-process trap",
            why,
        };
        let (plan, text) = plan_site(&code, addr).map_err(impossible)?;
        if let Some(why) = raw_syscalls::refusal(t.pid()) {
            return Err(impossible(why));
        }
        let probe_id = self.next_probe;
        if probe_id >= self.shm().layout().params.n_probes {
            return Err(FastPathError::Shm(
                "no probe id left: raise max_probes".into(),
            ));
        }
        t.stop_all()?;
        let post = extra & INPROC_POST != 0;
        let (kind, resume, next, execution) = match plan {
            Plan::Boost(instr) if post => {
                if instr.flow_control() != FlowControl::Next {
                    return Err(impossible(format!(
                        "{text}: a post handler after a branch needs a single-step"
                    )));
                }
                let back = addr + instr.len() as u64;
                const COPY: u64 = 48;
                let at = self.alloc(t, addr, COPY)?;
                let mut bytes = relocate_alone(instr, at).map_err(impossible)?;
                let post_at = at + bytes.len() as u64;
                bytes.push(0xcc);
                if bytes.len() as u64 > COPY {
                    return Err(impossible(format!("copy of {} bytes", bytes.len())));
                }
                t.write_memory(RuntimeAddr(at), &bytes)?;
                // The int3 after the copy: published before any thread can
                // reach it (the site's own int3 is not written yet).
                if !self.shm().publish_inproc(
                    post_at,
                    probe_id,
                    INPROC_BOOST | INPROC_POST_SITE | INPROC_HANDLER,
                    back,
                    addr,
                ) {
                    return Err(FastPathError::Shm("in-process trap table full".into()));
                }
                (INPROC_BOOST, at, post_at, "boosted")
            }
            Plan::Boost(instr) => {
                let back = addr + instr.len() as u64;
                // Room for the longest re-encoding (a short branch made
                // long, `jrcxz`/`loop` through a helper jump) and the jmp back.
                const COPY: u64 = 48;
                let at = self.alloc(t, addr, COPY)?;
                let bytes = relocate(instr, at, back).map_err(impossible)?;
                if bytes.len() as u64 > COPY {
                    return Err(impossible(format!("copy of {} bytes", bytes.len())));
                }
                t.write_memory(RuntimeAddr(at), &bytes)?;
                (INPROC_BOOST, at, 0, "boosted")
            }
            Plan::Ret => (INPROC_RET, 0, 0, "emulated"),
            Plan::Call { target, next } => (INPROC_CALL, target, next, "emulated"),
        };
        self.next_probe += 1;
        let mut orig = [0u8];
        t.read_memory(RuntimeAddr(addr), &mut orig)?;
        if !self
            .shm()
            .publish_inproc(addr, probe_id, kind | INPROC_COUNT | extra, resume, next)
        {
            return Err(FastPathError::Shm("in-process trap table full".into()));
        }
        let ledger = self.ledger_publish(addr, &orig, &[0xcc], hotprobe_abi::LEDGER_INPROC);
        t.write_memory(RuntimeAddr(addr), &[0xcc])?;
        self.installed.push(Installed {
            addr,
            original: orig.to_vec(),
            written: vec![0xcc],
            key: 0,
            ledger,
        });
        Ok(InprocInfo {
            probe_id,
            addr,
            execution,
            instruction: text,
        })
    }

    /// Takes the in-process trap at `addr` out (the original byte back,
    /// counting stopped; its copy and table entry stay, see the module
    /// docs), with every thread stopped (left stopped). False when there
    /// is none.
    pub fn remove_inproc(
        &mut self,
        t: &mut ProcessTarget,
        addr: u64,
    ) -> Result<bool, FastPathError> {
        let Some(i) = self
            .installed
            .iter()
            .position(|s| s.addr == addr && s.key == 0)
        else {
            return Ok(false);
        };
        t.stop_all()?;
        let s = &self.installed[i];
        let mut live = [0u8];
        t.read_memory(RuntimeAddr(addr), &mut live)?;
        let found = live.to_vec();
        if let Some(outcome) = take_own_bytes_out(&mut live, &s.written, &s.original) {
            self.foreign.push(ForeignWrite {
                addr,
                expected: s.written.clone(),
                found,
                outcome,
            });
        }
        t.write_memory(RuntimeAddr(addr), &live)?;
        self.set_inproc_enabled(addr, true, false);
        self.shm().quiet_inproc(addr);
        let s = self.installed.remove(i);
        self.ledger_unpublish(s.ledger);
        Ok(true)
    }

    /// Enables or disables the in-process trap at `addr` (its counting,
    /// and its handler if it has one): a disabled one still executes the
    /// displaced instruction; its `int3` goes at detach.
    pub fn set_inproc_enabled(&self, addr: u64, handler: bool, enabled: bool) {
        let bits = INPROC_COUNT | if handler { INPROC_HANDLER } else { 0 };
        self.shm().set_inproc_bits(addr, bits, enabled);
        if let Some((_, info, _, post_at)) = self.shm().lookup_inproc(addr) {
            if handler && info & INPROC_POST != 0 && info & INPROC_KIND_MASK == INPROC_BOOST {
                self.shm().set_inproc_bits(post_at, INPROC_HANDLER, enabled);
            }
        }
    }

    /// Whether the agent reported the `SIGTRAP` handler the in-process
    /// traps need (it is installed at attach).
    pub fn inproc_ready(&self) -> bool {
        self.shm().header().status.load(Relaxed) & hotprobe_abi::STATUS_ATTACHED != 0
    }
}

/// What [`FastPath::add_stub_handler`] placed.
#[derive(Clone, Debug)]
pub struct StubHandlerInfo {
    /// The fast-path probe id (counter index).
    pub probe_id: u32,
    /// The site (the function's entry).
    pub addr: u64,
    /// Patch or jump.
    pub mechanism: crate::Mechanism,
}

impl FastPath {
    /// Places a handler probe at the entry of `f` (of the module at
    /// `path`, loaded at `bias`) on a patch or a jump, as `add_function`
    /// would place a count: the site's `call` goes to the agent's handler
    /// trampoline, which saves the register file and calls the tracer
    /// through the thread's handler slot — no signal, no ptrace stop
    /// (see [`FastPath::take_handler_call`]). Refused (`Impossible`) where
    /// the rewritten site is not the function's first instruction (an
    /// `mcount` call after the prologue) or the plan is the trap.
    pub fn add_stub_handler(
        &mut self,
        t: &mut ProcessTarget,
        path: &std::path::Path,
        bias: u64,
        f: &crate::FunctionInfo,
        choice: crate::MechanismChoice,
    ) -> Result<StubHandlerInfo, FastPathError> {
        use crate::{Mechanism, PatchKind};
        use hotprobe_abi::patch::{abs_jmp_stub, call_rel32};
        let entry = f.addr.wrapping_add(bias);
        let impossible = |why: String| FastPathError::Impossible {
            function: f.name.clone(),
            mechanism: "handler stub",
            why,
        };
        let plan = self.module(path)?.plan(f, choice)?;
        let site = plan.site.wrapping_add(bias);
        match plan.mechanism {
            Mechanism::Patch(PatchKind::Mcount) => {
                return Err(impossible(
                    "an mcount call is not the function's entry".into(),
                ))
            }
            Mechanism::Trap => return Err(impossible(plan.reason)),
            _ if site != entry => {
                return Err(impossible(format!(
                    "the site {site:#x} is not the function's entry"
                )))
            }
            _ => {}
        }
        let tramp = self.shm().handler_ctl().handler_trampoline.load(Relaxed);
        if tramp == 0 {
            return Err(impossible("the agent has no handler trampoline".into()));
        }
        let probe_id = self.next_probe;
        if probe_id >= self.shm().layout().params.n_probes {
            return Err(FastPathError::Shm(
                "no probe id left: raise max_probes".into(),
            ));
        }
        t.stop_all()?;
        // Where a `call` at `from` goes to reach the trampoline.
        let target = |fp: &mut FastPath, t: &mut ProcessTarget, from: u64| {
            if call_rel32(from, tramp).is_some() {
                return Ok(tramp);
            }
            let stub = fp.alloc(t, from, 16)?;
            t.write_memory(RuntimeAddr(stub), &abs_jmp_stub(tramp))?;
            Ok::<u64, FastPathError>(stub)
        };
        let bits = hotprobe_abi::ACTION_COUNT;
        let key = match plan.mechanism {
            Mechanism::Patch(_) => {
                let to = target(self, t, site)?;
                let mut bytes = call_rel32(site, to).expect("within reach").to_vec();
                bytes.resize(plan.len, 0x90);
                self.next_probe += 1;
                self.install(t, site, &bytes, site + 5, probe_id, bits)?;
                site + 5
            }
            Mechanism::Jump => {
                let mut code = vec![0u8; (f.size + f.padding) as usize];
                t.read_memory(RuntimeAddr(entry), &mut code)?;
                let jp = hotprobe_x86::plan_jump_padded(&code, f.size as usize, entry, site)?;
                let at = self.alloc(t, site, 64)?;
                let to = target(self, t, at)?;
                let mut body = call_rel32(at, to).expect("within reach").to_vec();
                body.extend(jp.relocate(at + 5)?);
                if body.len() > 64 {
                    return Err(FastPathError::NoTrampolineMemory {
                        addr: site,
                        why: "trampoline longer than 64 bytes".into(),
                    });
                }
                t.write_memory(RuntimeAddr(at), &body)?;
                let bytes = jp.patch_bytes(at).expect("trampoline within reach");
                self.next_probe += 1;
                self.install(t, site, &bytes, at + 5, probe_id, bits)?;
                at + 5
            }
            Mechanism::Trap => unreachable!("refused above"),
        };
        self.handler_keys.insert(key, site);
        Ok(StubHandlerInfo {
            probe_id,
            addr: site,
            mechanism: plan.mechanism,
        })
    }
}

/// A thread waiting in a shared-memory handler call
/// ([`FastPath::take_handler_call`]).
#[derive(Clone, Debug)]
pub struct HandlerCall {
    slot: usize,
    /// The thread (Linux tid).
    pub tid: u32,
    /// The site's counter (fast-path probe id).
    pub counter: u32,
    /// The probed address.
    pub addr: u64,
    /// The thread's registers at the hit (`rip` = `addr`); segment and
    /// base registers are not carried (zero).
    pub regs: Registers,
    /// For a call from a patch or jump site's handler trampoline: the
    /// site key the thread resumes at when `rip` stays `addr`.
    key: Option<u64>,
    /// The call is for the post handler (after the displaced instruction:
    /// `rip` is where the thread goes next).
    pub post: bool,
}

/// `ucontext` `gregs` order of a handler slot's registers.
fn regs_from_slot(w: &[u64]) -> Registers {
    Registers {
        r8: w[0],
        r9: w[1],
        r10: w[2],
        r11: w[3],
        r12: w[4],
        r13: w[5],
        r14: w[6],
        r15: w[7],
        rdi: w[8],
        rsi: w[9],
        rbp: w[10],
        rbx: w[11],
        rdx: w[12],
        rax: w[13],
        rcx: w[14],
        rsp: w[15],
        rip: w[16],
        rflags: w[17],
        ..Registers::default()
    }
}

fn regs_to_slot(r: &Registers) -> [u64; hotprobe_abi::HANDLER_REGS] {
    [
        r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rdi, r.rsi, r.rbp, r.rbx, r.rdx,
        r.rax, r.rcx, r.rsp, r.rip, r.rflags,
    ]
}

impl FastPath {
    /// How long a thread spins for its handler's answer before it sleeps
    /// (futex), and how long it waits for the tracer to take a request
    /// before it resumes unmodified (counted missed).
    pub fn set_handler_wait(&self, spin: Duration, timeout: Duration) {
        let c = self.shm().handler_ctl();
        c.spin_ns.store(spin.as_nanos() as u64, Relaxed);
        c.timeout_ns
            .store(timeout.as_nanos().max(1) as u64, Relaxed);
    }

    /// The doorbell: bumped by every request (pass it to
    /// [`FastPath::wait_handler_calls`]).
    pub fn handler_doorbell(&self) -> u32 {
        self.shm()
            .handler_ctl()
            .doorbell
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Has the doorbell rung (bumped and woken) also when a child or
    /// tracee of this process has a wait status, by the process's waiter
    /// thread (`hotprobe_os::wake_on_child`), until the guard is dropped:
    /// a wait for handler calls then also ends at a ptrace stop of the
    /// traced target. `None` when no waiter thread can be had. The agent
    /// only ever adds to the doorbell: a bump by the tracer changes
    /// nothing for it.
    pub fn ring_doorbell_on_child(&self) -> Option<hotprobe_os::ChildWake<'_>> {
        hotprobe_os::wake_on_child(&self.shm().handler_ctl().doorbell)
    }

    /// Waits until the doorbell differs from `seen`: spins for `spin`,
    /// then sleeps on it (futex) until `deadline`. False when a signal
    /// interrupted the sleep (the caller looks at why it was sent).
    pub fn wait_handler_calls(&self, seen: u32, spin: Duration, deadline: Instant) -> bool {
        let c = self.shm().handler_ctl();
        let start = Instant::now();
        while self.handler_doorbell() == seen {
            let now = Instant::now();
            if now >= deadline {
                return true;
            }
            if now - start < spin {
                if now - start > Duration::from_micros(2) {
                    // Past a short pure spin, yield at each check (the
                    // target's thread may be waiting for this core).
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            c.tracer_sleeping
                .store(1, std::sync::atomic::Ordering::SeqCst);
            let waited = if self.handler_doorbell() == seen {
                hotprobe_os::futex_wait(&c.doorbell, seen, Some(deadline - now))
            } else {
                Ok(hotprobe_os::FutexWaited::Changed)
            };
            c.tracer_sleeping.store(0, Relaxed);
            if matches!(waited, Ok(hotprobe_os::FutexWaited::Interrupted)) {
                return false;
            }
        }
        true
    }

    /// Takes one waiting handler call, if any (its thread waits until
    /// [`FastPath::finish_handler_call`]).
    ///
    /// Round robin: the scan starts one past the slot last taken. A waiting
    /// request is taken within one pass over the other slots, however
    /// often they ask again. (Scanning from slot 0 each time starved a
    /// high slot while lower ones kept re-asking — their threads resume
    /// and ask again while the session runs the next handler — until its
    /// thread withdrew the request after the timeout: a lost handler run.)
    pub fn take_handler_call(&self) -> Option<HandlerCall> {
        use std::sync::atomic::Ordering::Acquire;
        let shm = self.shm();
        let n =
            (shm.handler_ctl().in_use.load(Acquire) as usize).min(shm.handler_capacity() as usize);
        if n == 0 {
            return None;
        }
        let first = self.handler_cursor.load(Relaxed) % n;
        for i in (first..n).chain(0..first) {
            // Slots past the trap table's are in the thread-slot chunks.
            let Some(s) = shm.handler_slot_at(i as u32) else {
                continue;
            };
            if s.state.load(Relaxed) != HANDLER_REQUEST {
                continue;
            }
            // Acquire pairs with the agent's Release store of REQUEST.
            if s.state
                .compare_exchange(HANDLER_REQUEST, HANDLER_BUSY, Acquire, Relaxed)
                .is_err()
            {
                continue;
            }
            let w: Vec<u64> = s.regs.iter().map(|r| r.load(Relaxed)).collect();
            let mut call = HandlerCall {
                slot: i,
                tid: s.tid.load(Relaxed),
                counter: s.counter.load(Relaxed),
                addr: s.addr.load(Relaxed),
                regs: regs_from_slot(&w),
                key: None,
                post: s.flags.load(Relaxed) & HANDLER_POST != 0,
            };
            if s.flags.load(Relaxed) & HANDLER_STUB != 0 {
                // From a handler trampoline: `addr` and `rip` are the key.
                let key = call.addr;
                let site = self.handler_keys.get(&key).copied().unwrap_or(key);
                call.addr = site;
                call.regs.rip = site;
                call.key = Some(key);
            }
            self.handler_cursor.store(i + 1, Relaxed);
            return Some(call);
        }
        None
    }

    /// Ends a handler call: the thread resumes with `regs` (when the
    /// handler changed them) and is woken if it sleeps.
    pub fn finish_handler_call(&self, call: &HandlerCall, regs: Option<&Registers>) {
        let Some(s) = self.shm().handler_slot_at(call.slot as u32) else {
            return;
        };
        if let Some(r) = regs {
            let mut words = regs_to_slot(r);
            if let (Some(key), true) = (call.key, r.rip == call.addr) {
                // Unmoved: the trampoline returns to the site's key.
                words[16] = key;
            }
            for (w, v) in s.regs.iter().zip(words) {
                w.store(v, Relaxed);
            }
            s.flags.fetch_or(HANDLER_MODIFIED, Relaxed);
        }
        // Release pairs with the agent's Acquire load of DONE; a locked
        // exchange (a full barrier) so that the flag read below is not
        // ordered before it (the agent sets SLEEPING with a locked RMW
        // before its futex compares the state: one of the two sees the other).
        s.state
            .swap(HANDLER_DONE, std::sync::atomic::Ordering::SeqCst);
        if s.flags.load(Relaxed) & HANDLER_SLEEPING != 0 {
            let _ = hotprobe_os::futex_wake(&s.state, 1);
        }
    }

    /// Handler calls not made: withdrawn after the timeout, or refused (no
    /// slot, a nested hit).
    pub fn handlers_missed(&self) -> u64 {
        self.shm().handler_ctl().missed.load(Relaxed)
    }
}

/// Up to `buf.len()` bytes at `addr` (fewer near the end of a mapping).
fn read_code(t: &mut ProcessTarget, addr: u64, buf: &mut [u8]) -> Result<(), FastPathError> {
    let mut n = buf.len();
    loop {
        match t.read_memory(RuntimeAddr(addr), &mut buf[..n]) {
            Ok(()) => return Ok(()),
            Err(e) if n <= 1 => return Err(e.into()),
            Err(_) => n /= 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_ret_call_and_boosts_the_rest() {
        // ret
        assert!(matches!(plan_site(&[0xc3], 0x1000), Ok((Plan::Ret, _))));
        // call rel32 +0x10
        match plan_site(&[0xe8, 0x10, 0, 0, 0], 0x1000) {
            Ok((Plan::Call { target, next }, _)) => {
                assert_eq!((target, next), (0x1015, 0x1005));
            }
            _ => panic!("call not emulated"),
        }
        // xchg eax, edi; mov rax, [rip+0x100]; jmp rel8
        for code in [&[0x97][..], &[0x48, 0x8b, 0x05, 0, 1, 0, 0], &[0xeb, 0x10]] {
            assert!(matches!(plan_site(code, 0x1000), Ok((Plan::Boost(_), _))));
        }
        // int3, call [rax]
        assert!(plan_site(&[0xcc], 0x1000).is_err());
        assert!(plan_site(&[0xff, 0x10], 0x1000).is_err());
    }

    #[test]
    fn relocated_copy_keeps_rip_relative_target_and_jumps_back() {
        let (Plan::Boost(i), _) = plan_site(&[0x48, 0x8b, 0x05, 0, 1, 0, 0], 0x40_1000).unwrap()
        else {
            panic!()
        };
        let at = 0x40_8000u64;
        let code = relocate(i, at, 0x40_1007).unwrap();
        let mut d = iced_x86::Decoder::with_ip(64, &code, at, 0);
        let a = d.decode();
        assert_eq!(a.memory_displacement64(), 0x40_1107);
        let b = d.decode();
        assert_eq!(b.near_branch_target(), 0x40_1007);
    }
}
