//! Installing a site: planning, stubs and trampolines, the bytes
//! written (held back in a batch or written at once).

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use hotprobe_abi::patch::{
    call_rel32, jmp_rel32, tail_exit_stub, NEAR_STUB_ENTRY, NEAR_STUB_EXIT, TAIL_STUB_KEY_OFFSET,
};
use hotprobe_abi::{ACTION_ALT_COUNTER, ACTION_COUNTER_SHIFT, ACTION_EXIT, EVENT_SIZE_FULL};
use hotprobe_process::ProcessTarget;
use hotprobe_target::{RuntimeAddr, Target};
use hotprobe_x86::plan_jump_padded;

use crate::foreign::all_nops;
use crate::pool::{write_spans, STUB_ROOM};
use crate::stub::{self, StubKind};
use crate::{
    Action, ExitSite, FastPath, FastPathError, FunctionInfo, Installed, Mechanism, MechanismChoice,
    ModuleInfo, PatchKind, SiteInfo, SitePlan,
};

/// Which stub a site gets: the registers it records, its counter and
/// probe id, and whether it hooks the function's return.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StubSite {
    /// Entry or exit registers.
    pub kind: StubKind,
    /// Counter index incremented on each hit.
    pub counter: u32,
    /// Probe id written into events.
    pub probe: u32,
    /// Hook the return (see [`stub::StubParams::hook`]).
    pub hook: bool,
}

impl StubSite {
    /// An exit placeholder's stub: exit `counter`, events of `probe`.
    fn exit(counter: u32, probe: u32) -> StubSite {
        StubSite {
            kind: StubKind::Exit,
            counter,
            probe,
            hook: false,
        }
    }
}

impl FastPath {
    pub(crate) fn module(&mut self, path: &Path) -> Result<&ModuleInfo, FastPathError> {
        if !self.modules.contains_key(path) {
            let m = ModuleInfo::open(path)?;
            self.modules.insert(path.to_path_buf(), m);
        }
        Ok(&self.modules[path])
    }

    /// Probes `function` of the main executable: picks the mechanism
    /// (or uses `choice`), installs it with every thread stopped, and says
    /// what it did. [`Mechanism::Trap`] installs nothing. Threads stay
    /// stopped; resume them with `t.resume_all()`.
    pub fn add(
        &mut self,
        t: &mut ProcessTarget,
        function: &str,
        action: Action,
        choice: MechanismChoice,
    ) -> Result<SiteInfo, FastPathError> {
        let syms = hotprobe_symbols::ProcessSymbols::for_pid(t.pid() as u32)?;
        let main = syms
            .main_module()
            .ok_or_else(|| FastPathError::NoSuchFunction(function.into()))?;
        let bias = main.bias.0;
        let path = main.path.clone();
        let f = self
            .module(&path)?
            .function(function)
            .cloned()
            .ok_or_else(|| FastPathError::NoSuchFunction(function.into()))?;
        self.add_function(t, &path, bias, &f, action, choice)
    }

    /// The function of the module at `path` whose entry is at link address
    /// `link_addr` (or, failing that, named `name`), as the planner sees it.
    pub fn function_at(
        &mut self,
        path: &Path,
        link_addr: u64,
        name: Option<&str>,
    ) -> Result<FunctionInfo, FastPathError> {
        let m = self.module(path)?;
        m.function_at(link_addr)
            .or_else(|| name.and_then(|n| m.function(n)))
            .cloned()
            .ok_or_else(|| {
                FastPathError::NoSuchFunction(
                    name.map_or_else(|| format!("{link_addr:#x}"), str::to_string),
                )
            })
    }

    /// The mechanism `f` (a function of the module at `path`) gets under
    /// `choice`, and why, without installing anything.
    pub fn plan(
        &mut self,
        path: &Path,
        f: &FunctionInfo,
        choice: MechanismChoice,
    ) -> Result<SitePlan, FastPathError> {
        let plan = self.module(path)?.plan(f, choice)?;
        if !plan.punned {
            return Ok(plan);
        }
        // Planned from the file: whether a trampoline fits a window now.
        match self.pun_check(path, f) {
            Ok(()) => Ok(plan),
            Err(why) if choice == MechanismChoice::Jump => Err(FastPathError::Impossible {
                function: f.name.clone(),
                mechanism: "jump",
                why: format!("punned jump: {why}"),
            }),
            Err(why) => Ok(SitePlan {
                mechanism: Mechanism::Trap,
                reason: format!(
                    "function shorter than 5 bytes ({} bytes), no padding after it, and no \
                     punned jump: {why}",
                    f.size
                ),
                site: f.addr,
                len: 1,
                exits: vec![],
                punned: false,
            }),
        }
    }

    /// Probes function `f` of the module at `path`, loaded with load bias
    /// `bias`: picks the mechanism (or uses `choice`), installs it with
    /// every thread stopped, and says what it did. [`Mechanism::Trap`]
    /// installs nothing. Threads stay stopped.
    pub fn add_function(
        &mut self,
        t: &mut ProcessTarget,
        path: &Path,
        bias: u64,
        f: &FunctionInfo,
        action: Action,
        choice: MechanismChoice,
    ) -> Result<SiteInfo, FastPathError> {
        let function = f.name.as_str();
        let f = f.clone();
        let plan = self.plan(path, &f, choice)?;
        let probe_id = self.next_probe;
        let mut info = SiteInfo {
            function: function.to_string(),
            probe_id,
            addr: plan.site.wrapping_add(bias),
            mechanism: plan.mechanism,
            reason: plan.reason.clone(),
            exits: "none",
            exit_probe_id: None,
            stub: false,
        };
        if plan.mechanism == Mechanism::Trap {
            return Ok(info);
        }
        if action.record
            && action.xmm.is_some()
            && self.shm().layout().params.event_size != EVENT_SIZE_FULL
        {
            return Err(FastPathError::Shm(
                "float/double values need 64-byte event slots (record_args > 2)".into(),
            ));
        }
        if action.record
            && action.xmm.is_some()
            && action.exit
            && plan.mechanism == Mechanism::Patch(PatchKind::Coldpatch)
        {
            // An exit placeholder (`__cyg_profile_func_exit`'s call) runs
            // before the return value is in xmm0.
            return Err(FastPathError::Shm(
                "float/double return values are not in xmm0 at coldpatch exit placeholders".into(),
            ));
        }
        if let (true, Some(prog)) = (action.record, &action.capture) {
            if self.shm().layout().params.event_size != EVENT_SIZE_FULL {
                return Err(FastPathError::Shm(
                    "typed values copied in the target need 64-byte event slots (record_args > 2)"
                        .into(),
                ));
            }
            if plan.mechanism == Mechanism::Patch(PatchKind::Coldpatch) {
                // The placeholder runs after the prologue: neither the
                // argument registers nor the stack are the entry's.
                return Err(FastPathError::Shm(
                    "typed values are not copied at coldpatch placeholders".into(),
                ));
            }
            // The program before the site: no hit finds it missing.
            let shm = self.shm();
            let exit_ok = match (&prog.exit, action.exit) {
                (Some(x), true) => hotprobe_abi::capture::publish_exit(shm, probe_id, x),
                _ => {
                    // A probe id handed out again (a placement that failed
                    // after publishing) keeps no exit program of another.
                    hotprobe_abi::capture::withdraw_exit(shm, probe_id);
                    true
                }
            };
            if probe_id < shm.layout().params.n_probes
                && !(hotprobe_abi::capture::publish(shm, probe_id, &prog.entry) && exit_ok)
            {
                return Err(FastPathError::Shm(format!(
                    "the capture table is full ({} functions copy typed values in the target)",
                    hotprobe_abi::capture::CAPTURE_SLOTS
                )));
            }
        }
        if probe_id >= self.shm().layout().params.n_probes {
            return Err(FastPathError::Shm(
                "no probe id left: raise max_probes".into(),
            ));
        }
        let site = plan.site.wrapping_add(bias);
        // A patch site's key is the address after its call (`install`):
        // one already in the site table is this fast path's own patch.
        let ours = || self.shm().lookup_site(site + 5).is_some();
        if matches!(plan.mechanism, Mechanism::Patch(_)) && !ours() {
            // Planned from the file: the placeholder in memory must still
            // be NOPs (a kernel uprobe's int3 or call goes over it).
            let (mut small, mut big) = ([0u8; 16], Vec::new());
            let live: &mut [u8] = match small.get_mut(..plan.len) {
                Some(s) => s,
                None => {
                    big.resize(plan.len, 0);
                    &mut big
                }
            };
            self.read_original(t, site, live)?;
            if !all_nops(live) {
                return Err(FastPathError::Impossible {
                    function: function.to_string(),
                    mechanism: "patch",
                    why: format!(
                        "its placeholder is no NOP in memory ({}): a breakpoint already (a kernel \
                         uprobe's, another debugger's)",
                        live.iter()
                            .map(|b| format!("{b:02x}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    ),
                });
            }
        }
        if let Some(rule) = action.agg {
            // The rule before the site: no hit finds it missing.
            hotprobe_abi::agg::define(self.shm(), probe_id, rule)
                .map_err(|e| FastPathError::Shm(e.to_string()))?;
        }
        self.next_probe += 1;
        let bits = action.bits();
        if bits & hotprobe_abi::ACTION_RECORD != 0 {
            // Ring starts in memory before a thread's first event.
            self.shm.keep_rings_ready();
        }
        t.stop_all()?;
        if bits & hotprobe_abi::ACTION_RECORD != 0 {
            // And mapped in the target before its next threads start.
            self.map_ring_pool(t);
        }
        match plan.mechanism {
            Mechanism::Patch(kind) => {
                let mut bits = bits;
                let coldpatch = kind == PatchKind::Coldpatch;
                if action.exit && !coldpatch {
                    bits |= ACTION_EXIT;
                    info.exits = "return hook";
                }
                if coldpatch {
                    // The placeholder runs after the prologue: the stack is
                    // not as at the first instruction, no walk starts there.
                    bits &= !hotprobe_abi::ACTION_STACK;
                }
                let target = self.entry_target(t, site, probe_id, action, bits, &mut info)?;
                let mut bytes = call_rel32(site, target)
                    .expect("target within reach")
                    .to_vec();
                bytes.resize(plan.len, 0x90);
                self.install(t, site, &bytes, site + 5, probe_id, bits)?;
                if action.exit && coldpatch {
                    info.exits = "exit placeholders";
                    let exit_id = self.next_probe;
                    if exit_id >= self.shm().layout().params.n_probes
                        || exit_id >= hotprobe_abi::ACTION_COUNTER_LIMIT
                    {
                        return Err(FastPathError::Shm(
                            "no probe id left: raise max_probes".into(),
                        ));
                    }
                    self.next_probe += 1;
                    info.exit_probe_id = Some(exit_id);
                    let bits = bits | ACTION_ALT_COUNTER | exit_id << ACTION_COUNTER_SHIFT;
                    for e in &plan.exits {
                        match *e {
                            ExitSite::Call(a) => {
                                let a = a.wrapping_add(bias);
                                let target = match self.stub(
                                    t,
                                    a,
                                    StubSite::exit(exit_id, probe_id),
                                    action,
                                )? {
                                    Some(s) => s,
                                    None => self.call_target(t, a, NEAR_STUB_EXIT)?,
                                };
                                let mut b = call_rel32(a, target).expect("in reach").to_vec();
                                let mut old = [0u8; 6];
                                t.read_memory(RuntimeAddr(a), &mut old)?;
                                if old[..5] != hotprobe_abi::patch::NOP5
                                    && old != hotprobe_abi::patch::NOP6
                                {
                                    continue;
                                }
                                if old == hotprobe_abi::patch::NOP6 {
                                    b.push(0x90);
                                }
                                self.install(t, a, &b, a + 5, probe_id, bits)?;
                            }
                            ExitSite::Tail(a) => {
                                let a = a.wrapping_add(bias);
                                // The tail stub calls the per-site exit stub
                                // (or the generic exit trampoline) through
                                // its absolute address.
                                let exit_tramp = match self.stub(
                                    t,
                                    a,
                                    StubSite::exit(exit_id, probe_id),
                                    action,
                                )? {
                                    Some(s) => s,
                                    None => self.shm().header().exit_trampoline.load(Relaxed),
                                };
                                let stub = self.alloc(t, a, 16)?;
                                self.write(t, stub, &tail_exit_stub(exit_tramp))?;
                                let b = jmp_rel32(a, stub).expect("stub within reach");
                                self.install(
                                    t,
                                    a,
                                    &b,
                                    stub + TAIL_STUB_KEY_OFFSET,
                                    probe_id,
                                    bits,
                                )?;
                            }
                        }
                    }
                }
            }
            Mechanism::Jump if plan.punned => {
                let mut bits = bits;
                if action.exit {
                    bits |= ACTION_EXIT;
                    info.exits = "return hook";
                }
                let owned = (f.size + f.padding).min(4) as usize;
                let fstart = f.addr.wrapping_add(bias);
                let file = self
                    .module(path)?
                    .code(f.addr, owned as u64 + 4)
                    .map(<[u8]>::to_vec)
                    .ok_or_else(|| FastPathError::Impossible {
                        function: function.to_string(),
                        mechanism: "jump",
                        why: "the bytes after the function are not in the file".into(),
                    })?;
                let mut stub_info = info.clone();
                let (bytes, tramps) = self.place_pun(t, &f, fstart, &file, |fp, t, tramp| {
                    let target =
                        fp.entry_target(t, tramp, probe_id, action, bits, &mut stub_info)?;
                    Ok(call_rel32(tramp, target).expect("in reach").to_vec())
                })?;
                info.stub = stub_info.stub;
                // The copies' keys (where the jump lands once a probe on
                // the next function changed its first byte) before the site.
                for &copy in &tramps[1..] {
                    self.shm()
                        .insert_site(copy + 5, probe_id, bits)
                        .map_err(|e| FastPathError::Shm(e.to_string()))?;
                }
                self.install(t, site, &bytes, tramps[0] + 5, probe_id, bits)?;
            }
            Mechanism::Jump => {
                let mut code = vec![0u8; (f.size + f.padding) as usize];
                let fstart = f.addr.wrapping_add(bias);
                t.read_memory(RuntimeAddr(fstart), &mut code)?;
                let jp = plan_jump_padded(&code, f.size as usize, fstart, site)?;
                let mut bits = bits;
                if action.exit {
                    bits |= ACTION_EXIT;
                    info.exits = "return hook";
                }
                let tramp = self.alloc(t, site, 64)?;
                let target = self.entry_target(t, tramp, probe_id, action, bits, &mut info)?;
                let mut body = call_rel32(tramp, target).expect("in reach").to_vec();
                body.extend(jp.relocate(tramp + 5)?);
                if body.len() > 64 {
                    return Err(FastPathError::NoTrampolineMemory {
                        addr: site,
                        why: "trampoline longer than 64 bytes".into(),
                    });
                }
                self.write(t, tramp, &body)?;
                let bytes = jp.patch_bytes(tramp).expect("trampoline within reach");
                self.install(t, site, &bytes, tramp + 5, probe_id, bits)?;
            }
            Mechanism::Trap => unreachable!("returned above"),
        }
        Ok(info)
    }

    /// Where the entry `call` at `at` (a site or a jump trampoline) goes:
    /// a per-site stub (which, for a recorded entry whose return is hooked,
    /// hooks it through the agent's `ThreadBlock::hook_entry`), or the
    /// agent's generic entry trampoline.
    pub(crate) fn entry_target(
        &mut self,
        t: &mut ProcessTarget,
        at: u64,
        probe_id: u32,
        action: Action,
        bits: u32,
        info: &mut SiteInfo,
    ) -> Result<u64, FastPathError> {
        // An aggregation, a stack walk or a typed capture needs the
        // agent's generic path: stubs do none of them. A return hook needs
        // it too, but for a recorded entry without xmm values (the stub
        // hooks through the agent).
        let generic =
            hotprobe_abi::ACTION_AGG | hotprobe_abi::ACTION_STACK | hotprobe_abi::ACTION_CAPTURE;
        let hook = bits & ACTION_EXIT != 0;
        let stub = if bits & generic == 0 && (!hook || (action.record && action.xmm.is_none())) {
            let site = StubSite {
                kind: StubKind::Entry,
                counter: probe_id,
                probe: probe_id,
                hook,
            };
            self.stub(t, at, site, action)?
        } else {
            None
        };
        info.stub = stub.is_some();
        match stub {
            Some(s) => Ok(s),
            None => self.call_target(t, at, NEAR_STUB_ENTRY),
        }
    }

    /// Writes the per-site stub of `site` (see the `stub` module) within
    /// ±2 GiB of `near` and returns its address; `None` when stubs are
    /// off, the agent published no TLS offset, or the action is an
    /// aggregation (the generic trampoline is used then).
    pub(crate) fn stub(
        &mut self,
        t: &mut ProcessTarget,
        near: u64,
        site: StubSite,
        action: Action,
    ) -> Result<Option<u64>, FastPathError> {
        let StubSite {
            kind,
            counter,
            probe,
            hook,
        } = site;
        let (record, xmm) = (action.record, action.xmm);
        let h = self.shm().header();
        let tpoff = h.thread_tpoff.load(Relaxed);
        // An aggregation (return values at exit placeholders too) is the
        // agent's: no stub.
        if !self.stubs || tpoff == 0 || action.agg.is_some() {
            return Ok(None);
        }
        let generic = match kind {
            StubKind::Entry => h.entry_trampoline.load(Relaxed),
            StubKind::Exit => h.exit_trampoline.load(Relaxed),
        };
        let p = stub::StubParams {
            tpoff,
            counter,
            probe,
            kind,
            record,
            generic,
            event_size: self.shm().layout().params.event_size,
            key: self.shm().stub_key(),
            missed_offset: self.shm().layout().missed_offset as u64,
            xmm_ints: if record { xmm } else { None },
            hook,
        };
        let err = |e: stub::StubError| FastPathError::Assemble {
            addr: near,
            why: e.to_string(),
        };
        // Assembled once, in place at the next free address of a pool with
        // room (the common case), else sized first and placed in a new pool.
        let (at, code) = match self.pool_with_room(near, STUB_ROOM) {
            Some(i) => {
                let at = self.pools[i].next;
                let code = self.templates.build(&p).map_err(err)?;
                let len = (code.len() as u64 + 63) & !63;
                if len > STUB_ROOM {
                    return Err(FastPathError::Assemble {
                        addr: near,
                        why: format!("a stub of {} bytes (at most {STUB_ROOM})", code.len()),
                    });
                }
                self.pools[i].next += len;
                (at, code)
            }
            None => {
                let len = stub::build(0, &p).map_err(err)?.len() as u64;
                let at = self.alloc(t, near, len)?;
                (at, stub::build(at, &p).map_err(err)?)
            }
        };
        self.write(t, at, &code)?;
        Ok(Some(at))
    }

    /// The address a `call` at `from` should target to reach the agent's
    /// trampoline behind near-page stub `stub_off`: the trampoline itself
    /// when within ±2 GiB, else the agent's near-page stub, else a stub of
    /// ours allocated near `from`.
    pub(crate) fn call_target(
        &mut self,
        t: &mut ProcessTarget,
        from: u64,
        stub_off: u64,
    ) -> Result<u64, FastPathError> {
        let h = self.shm().header();
        let tramp = if stub_off == NEAR_STUB_EXIT {
            h.exit_trampoline.load(Relaxed)
        } else {
            h.entry_trampoline.load(Relaxed)
        };
        if call_rel32(from, tramp).is_some() {
            return Ok(tramp);
        }
        let near = h.near_page.load(Relaxed);
        if near != 0 && call_rel32(from, near + stub_off).is_some() {
            return Ok(near + stub_off);
        }
        let stub = self.alloc(t, from, 16)?;
        self.write(t, stub, &hotprobe_abi::patch::abs_jmp_stub(tramp))?;
        Ok(stub)
    }

    /// Writes `bytes` at `addr` in the target now, or at the end of the
    /// open batch.
    pub(crate) fn write(
        &mut self,
        t: &mut ProcessTarget,
        addr: u64,
        bytes: &[u8],
    ) -> Result<(), FastPathError> {
        match &mut self.batch {
            Some(b) => b.push((addr, bytes.to_vec())),
            None => t.write_memory(RuntimeAddr(addr), bytes)?,
        }
        Ok(())
    }

    /// Opens a batch: until [`FastPath::end_batch`], the code this fast
    /// path writes (stubs, trampolines, patched sites) is held back and
    /// then written span by span — one read and one write of
    /// `/proc/PID/mem` per run of nearby sites (about a page of text)
    /// instead of two per site. The target's threads must stay stopped
    /// from the first [`FastPath::add_function`] of the batch to its end
    /// (nothing held back is ever half written: a thread that ran in
    /// between would run the original code).
    pub fn begin_batch(&mut self) {
        if self.batch.is_none() {
            self.batch = Some(Vec::new());
            self.page_cache = None;
        }
    }

    /// Whether a batch is open (see [`FastPath::begin_batch`]).
    pub fn in_batch(&self) -> bool {
        self.batch.is_some()
    }

    /// Writes what the open batch held back (see [`FastPath::begin_batch`])
    /// and closes it. Threads stay stopped.
    pub fn end_batch(&mut self, t: &mut ProcessTarget) -> Result<(), FastPathError> {
        self.page_cache = None;
        let Some(writes) = self.batch.take() else {
            return Ok(());
        };
        let bps = t.breakpoints().into_iter().map(|b| b.0).collect();
        // Stubs and trampolines first, the sites that call or jump into
        // them after: a tracer killed between two writes leaves no site
        // going to a pool still full of `int3`.
        let (pooled, sites): (Vec<_>, Vec<_>) = writes
            .into_iter()
            .partition(|(a, _)| self.pools.iter().any(|p| (p.start..p.end).contains(a)));
        write_spans(t, pooled, Some(&bps), false)?;
        write_spans(t, sites, Some(&bps), true)
    }

    /// Writes `bytes` at `addr` once no thread's PC lies strictly inside
    /// them (resuming the threads briefly while one does), after publishing
    /// the site key and the site in the code ledger. Expects every thread
    /// stopped; leaves them stopped.
    pub(crate) fn install(
        &mut self,
        t: &mut ProcessTarget,
        addr: u64,
        bytes: &[u8],
        key: u64,
        probe_id: u32,
        bits: u32,
    ) -> Result<(), FastPathError> {
        wait_pcs_outside(t, addr, bytes.len() as u64)?;
        let mut original = vec![0u8; bytes.len()];
        self.read_original(t, addr, &mut original)?;
        self.shm()
            .insert_site(key, probe_id, bits)
            .map_err(|e| FastPathError::Shm(e.to_string()))?;
        let owner = match bytes.first() {
            Some(0xe8) => hotprobe_abi::LEDGER_PATCH,
            _ => hotprobe_abi::LEDGER_JUMP,
        };
        // In the ledger before the bytes go in (see the `ledger` module).
        let ledger = self.ledger_publish(addr, &original, bytes, owner);
        match &mut self.batch {
            Some(b) => b.push((addr, bytes.to_vec())),
            None => crate::head_last::write_site(t, addr, bytes)?,
        }
        self.installed.push(Installed {
            addr,
            original,
            written: bytes.to_vec(),
            key,
            ledger,
        });
        Ok(())
    }

    /// Reads the bytes a site replaces. In a batch nothing is written until
    /// `end_batch`, so the page last read is kept and serves the next site
    /// on it (sites come in address order: one `pread` per page instead of
    /// one per site); a remote `mmap` ([`FastPath::alloc`]) forgets it.
    pub(crate) fn read_original(
        &mut self,
        t: &mut ProcessTarget,
        addr: u64,
        out: &mut [u8],
    ) -> Result<(), FastPathError> {
        let page = addr & !0xfff;
        let len = out.len() as u64;
        if self.batch.is_none() || (addr + len - 1) & !0xfff != page {
            t.read_memory(RuntimeAddr(addr), out)?;
            return Ok(());
        }
        if self.page_cache.as_ref().map(|(p, _)| *p) != Some(page) {
            let mut buf = vec![0u8; 4096];
            t.read_memory(RuntimeAddr(page), &mut buf)?;
            self.page_cache = Some((page, buf));
        }
        let (_, buf) = self.page_cache.as_ref().expect("filled above");
        let off = (addr - page) as usize;
        out.copy_from_slice(&buf[off..off + out.len()]);
        Ok(())
    }
}

pub(crate) fn wait_pcs_outside(
    t: &mut dyn Target,
    addr: u64,
    len: u64,
) -> Result<(), FastPathError> {
    for _ in 0..200 {
        let mut inside = false;
        for th in t.threads() {
            let rip = t.registers(th)?.rip;
            if rip > addr && rip < addr + len {
                inside = true;
            }
        }
        if !inside {
            return Ok(());
        }
        t.resume_all()?;
        std::thread::sleep(Duration::from_millis(1));
        t.stop_all()?;
    }
    Err(FastPathError::Busy { addr })
}
