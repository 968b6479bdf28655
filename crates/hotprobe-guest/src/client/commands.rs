//! The stub commands: stops, threads, breakpoints, registers, memory, detach.

use super::*;

impl GdbClient {
    /// Reads a target-description document with `qXfer:features:read`.
    pub fn read_feature(&mut self, annex: &str) -> Result<String, GdbError> {
        let mut out = Vec::new();
        let chunk = self.max_payload().min(0xffb);
        loop {
            let req = format!("qXfer:features:read:{annex}:{:x},{:x}", out.len(), chunk);
            let r = self.request(&req)?;
            match r.split_first() {
                Some((b'l', rest)) => {
                    out.extend_from_slice(rest);
                    break;
                }
                Some((b'm', rest)) if !rest.is_empty() => out.extend_from_slice(rest),
                _ => return Err(self.reply_error(&req, &r)),
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    pub(super) fn max_payload(&self) -> usize {
        self.features.packet_size.unwrap_or(400).clamp(64, 1 << 16)
    }

    /// The stop the target is in now (`?`).
    pub fn query_stop(&mut self) -> Result<StopReply, GdbError> {
        self.pending_stops.clear();
        let r = self.request_bytes(b"?", true)?;
        match StopReply::parse(&r) {
            Some(Ok(s)) => Ok(s),
            _ => Err(self.reply_error("?", &r)),
        }
    }

    /// The threads (for QEMU: vCPUs), from `qfThreadInfo`/`qsThreadInfo`.
    pub fn threads(&mut self) -> Result<Vec<ThreadRef>, GdbError> {
        let mut all = Vec::new();
        let mut req = "qfThreadInfo";
        loop {
            let r = self.request(req)?;
            let (mut ts, done) = rsp::parse_thread_list(&r).map_err(|e| GdbError::BadReply {
                stub: self.name.clone(),
                request: req.into(),
                why: e.to_string(),
            })?;
            if ts.is_empty() && !done && all.len() > 4096 {
                break;
            }
            all.append(&mut ts);
            if done {
                break;
            }
            req = "qsThreadInfo";
        }
        Ok(all)
    }

    pub(super) fn tid(&self, t: ThreadRef) -> String {
        if self.multiprocess {
            ThreadRef {
                pid: Some(t.pid.unwrap_or(1)),
                tid: t.tid,
            }
            .encode()
        } else {
            ThreadRef {
                pid: None,
                tid: t.tid,
            }
            .encode()
        }
    }

    /// Resumes every thread (`vCont;c`). The reply comes later through
    /// [`GdbClient::wait_stop`].
    pub fn cont(&mut self) -> Result<(), GdbError> {
        self.reg_thread = None;
        self.send_packet(b"vCont;c")
    }

    /// Resumes every thread, the current one (QEMU: the vCPU of the last
    /// stop) at `pc` (`c ADDR`): moving a thread and resuming in one packet,
    /// with no reply to wait for. The stop reply comes later through
    /// [`GdbClient::wait_stop`].
    pub fn cont_at(&mut self, pc: u64) -> Result<(), GdbError> {
        self.reg_thread = None;
        self.send_packet(format!("c{pc:x}").as_bytes())
    }

    /// Single-steps one thread, leaving the others stopped (`vCont;s:TID`).
    pub fn step(&mut self, thread: ThreadRef) -> Result<(), GdbError> {
        self.reg_thread = None;
        let p = format!("vCont;s:{}", self.tid(thread));
        self.send_packet(p.as_bytes())
    }

    /// Sends the interrupt byte (0x03); the stop reply comes through
    /// [`GdbClient::wait_stop`].
    pub fn interrupt(&mut self) -> Result<(), GdbError> {
        self.write_raw(&[0x03])
    }

    /// Waits for a stop reply at most `timeout`; `Ok(None)` if none came.
    /// `W`/`X` replies are returned (not errors) and mark the stub closed.
    pub fn wait_stop(&mut self, timeout: Option<Duration>) -> Result<Option<StopReply>, GdbError> {
        if let Some(s) = self.pending_stops.pop_front() {
            return Ok(Some(s));
        }
        // "Forever" is a long deadline in slices, so the socket is polled.
        let deadline = Instant::now() + timeout.unwrap_or(Duration::from_secs(365 * 24 * 3600));
        loop {
            let Some(p) = self.recv_packet(deadline)? else {
                return Ok(None);
            };
            match StopReply::parse(&p) {
                Some(Ok(StopReply::Output(o))) => self.console.extend_from_slice(&o),
                Some(Ok(r)) => {
                    if matches!(r, StopReply::Exited { .. } | StopReply::Terminated { .. }) {
                        self.closed = true;
                    }
                    if let StopReply::Signal {
                        signal: 5,
                        thread: Some(t),
                        ..
                    } = &r
                    {
                        // A trap stop makes the reported thread the one
                        // `g`/`p`/`P` apply to (QEMU's gdb_set_stop_cpu,
                        // gdbserver's general_thread): no `Hg` needed.
                        self.reg_thread = Some(*t);
                    }
                    return Ok(Some(r));
                }
                _ => {} // stray reply: ignore
            }
        }
    }

    /// As [`GdbClient::wait_stop`], also returning `Ok(None)` early when a
    /// signal interrupts the wait (a handler installed without
    /// `SA_RESTART`), so an event loop blocked here sees its stop flag.
    pub fn wait_stop_interruptible(
        &mut self,
        timeout: Option<Duration>,
    ) -> Result<Option<StopReply>, GdbError> {
        self.interruptible = true;
        let r = self.wait_stop(timeout);
        self.interruptible = false;
        r
    }

    /// Inserts a breakpoint of `kind` (0 software, 1 hardware) at `addr`.
    pub fn insert_breakpoint(&mut self, kind: u8, addr: u64) -> Result<(), GdbError> {
        self.request_ok(&format!("Z{kind},{addr:x},1"))
    }

    /// Removes a breakpoint of `kind` at `addr`.
    pub fn remove_breakpoint(&mut self, kind: u8, addr: u64) -> Result<(), GdbError> {
        self.request_ok(&format!("z{kind},{addr:x},1"))
    }

    /// Selects the thread later `g`/`G`/`p`/`P` apply to (`Hg`), if it changed.
    pub fn select_thread(&mut self, thread: ThreadRef) -> Result<(), GdbError> {
        if self.reg_thread == Some(thread) {
            return Ok(());
        }
        self.request_ok(&format!("Hg{}", self.tid(thread)))?;
        self.reg_thread = Some(thread);
        Ok(())
    }

    /// The raw `g` block of `thread`.
    pub fn read_g(&mut self, thread: ThreadRef) -> Result<Vec<u8>, GdbError> {
        self.select_thread(thread)?;
        let r = self.request("g")?;
        if r.first() == Some(&b'E') || r.is_empty() {
            return Err(self.reply_error("g", &r));
        }
        rsp::decode_hex(&r).map_err(|e| GdbError::BadReply {
            stub: self.name.clone(),
            request: "g".into(),
            why: e.to_string(),
        })
    }

    /// Writes a whole `g` block for `thread` (`G`).
    pub fn write_g(&mut self, thread: ThreadRef, g: &[u8]) -> Result<(), GdbError> {
        self.select_thread(thread)?;
        self.request_ok(&format!("G{}", rsp::encode_hex(g)))
    }

    /// Reads register number `regnum` of `thread` (`p`), little-endian bytes.
    pub fn read_register(&mut self, thread: ThreadRef, regnum: u32) -> Result<Vec<u8>, GdbError> {
        self.select_thread(thread)?;
        let req = format!("p{regnum:x}");
        let r = self.request(&req)?;
        if r.first() == Some(&b'E') || r.is_empty() {
            return Err(self.reply_error(&req, &r));
        }
        rsp::decode_hex(&r).map_err(|e| GdbError::BadReply {
            stub: self.name.clone(),
            request: req,
            why: e.to_string(),
        })
    }

    /// Writes register number `regnum` of `thread` (`P`).
    pub fn write_register(
        &mut self,
        thread: ThreadRef,
        regnum: u32,
        value: &[u8],
    ) -> Result<(), GdbError> {
        self.select_thread(thread)?;
        self.request_ok(&format!("P{regnum:x}={}", rsp::encode_hex(value)))
    }

    /// Switches `m`/`M` between guest-virtual (default) and guest-physical
    /// addresses (QEMU's `Qqemu.PhyMemMode`).
    pub fn set_phys_mode(&mut self, phys: bool) -> Result<(), GdbError> {
        if self.phys_mode == phys {
            return Ok(());
        }
        self.request_ok(&format!("Qqemu.PhyMemMode:{}", u8::from(phys)))?;
        self.phys_mode = phys;
        Ok(())
    }

    /// Reads memory (`m`), in packets as large as the stub takes.
    pub fn read_memory(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), GdbError> {
        let chunk = ((self.max_payload() - 8) / 2).max(16);
        let mut done = 0;
        while done < buf.len() {
            let n = chunk.min(buf.len() - done);
            let a = addr.wrapping_add(done as u64);
            let req = format!("m{a:x},{n:x}");
            let r = self.request(&req)?;
            if r.first() == Some(&b'E') || r.is_empty() {
                return Err(self.reply_error(&req, &r));
            }
            let bytes = rsp::decode_hex(&r).map_err(|e| GdbError::BadReply {
                stub: self.name.clone(),
                request: req.clone(),
                why: e.to_string(),
            })?;
            if bytes.is_empty() || bytes.len() > n {
                return Err(GdbError::BadReply {
                    stub: self.name.clone(),
                    request: req,
                    why: format!("{} bytes for {n}", bytes.len()),
                });
            }
            if let Some(dst) = buf.get_mut(done..done + bytes.len()) {
                dst.copy_from_slice(&bytes);
            }
            done += bytes.len();
        }
        Ok(())
    }

    /// Writes memory (`M`); QEMU writes even read-only guest pages.
    pub fn write_memory(&mut self, addr: u64, data: &[u8]) -> Result<(), GdbError> {
        let chunk = ((self.max_payload() - 40) / 2).max(16);
        for (i, part) in data.chunks(chunk).enumerate() {
            let a = addr.wrapping_add((i * chunk) as u64);
            let req = format!("M{a:x},{:x}:{}", part.len(), rsp::encode_hex(part));
            self.request_ok(&req)?;
        }
        Ok(())
    }

    /// Detaches (`D;1` after multiprocess+, else `D`): the stub removes its
    /// breakpoints and lets the VM run; the socket is closed.
    pub fn detach(&mut self) -> Result<(), GdbError> {
        let req = if self.multiprocess { "D;1" } else { "D" };
        let r = self.request(req);
        self.closed = true;
        self.stream.shutdown();
        match r {
            Ok(r) => self.check_ok(req, &r),
            Err(e) => Err(e),
        }
    }

    /// Whether the connection is known to be closed.
    pub fn is_closed(&self) -> bool {
        self.closed
    }
}
