//! A GDB remote-protocol client for QEMU's gdbstub (and any stub speaking the
//! same packets): connection over TCP (with TCP_NODELAY) or a unix socket,
//! the handshake, and one method per packet the guest target uses.
//!
//! Every read has a deadline; a closed connection, a `W`/`X` reply or a
//! garbled stream becomes a [`GdbError`], never a panic or a hang.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::rsp::{self, Decoder, Features, Frame, RegisterMap, StopReply, ThreadRef};

/// A failure talking to a GDB stub.
#[derive(Debug, thiserror::Error)]
pub enum GdbError {
    /// Connecting failed.
    #[error("cannot connect to gdb stub {addr}: {source}")]
    Connect {
        /// The address tried.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Reading or writing the socket failed.
    #[error("gdb stub {stub}: {op} failed: {source}")]
    Io {
        /// The stub.
        stub: String,
        /// `read` or `write`.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The stub closed the connection.
    #[error("gdb stub {stub} closed the connection")]
    Closed {
        /// The stub.
        stub: String,
    },
    /// No reply in time.
    #[error("gdb stub {stub}: no reply to {what} within {after:?}")]
    Timeout {
        /// The stub.
        stub: String,
        /// The request waited for.
        what: String,
        /// How long was waited.
        after: Duration,
    },
    /// The stub answered with an error code (`Exx`).
    #[error("gdb stub {stub}: {request} failed with {reply}")]
    ErrorReply {
        /// The stub.
        stub: String,
        /// The request (cut to 40 characters).
        request: String,
        /// The reply (`E14`...).
        reply: String,
    },
    /// The stub does not support a packet (empty reply).
    #[error("gdb stub {stub} does not support {request}")]
    Unsupported {
        /// The stub.
        stub: String,
        /// The request.
        request: String,
    },
    /// The reply made no sense.
    #[error("gdb stub {stub}: bad reply to {request}: {why}")]
    BadReply {
        /// The stub.
        stub: String,
        /// The request.
        request: String,
        /// What is wrong.
        why: String,
    },
    /// The target (the VM) exited or was killed (`W`/`X` reply).
    #[error("gdb stub {stub}: target ended ({reply:?})")]
    Exited {
        /// The stub.
        stub: String,
        /// The `W` or `X` reply.
        reply: StopReply,
    },
}

impl GdbError {
    /// Whether the stub is gone for good (closed, exited, socket error).
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            GdbError::Closed { .. }
                | GdbError::Exited { .. }
                | GdbError::Io { .. }
                | GdbError::Connect { .. }
        )
    }
}

/// The socket to the stub.
#[derive(Debug)]
pub enum Stream {
    /// A TCP connection (TCP_NODELAY set).
    Tcp(TcpStream),
    /// A unix-domain socket (QEMU `-chardev socket,path=...`).
    Unix(UnixStream),
}

impl Stream {
    fn set_read_timeout(&self, t: Duration) -> std::io::Result<()> {
        let t = Some(t.max(Duration::from_millis(1)));
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.write_all(buf),
            Stream::Unix(s) => s.write_all(buf),
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

/// Counters of what went over the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Packets sent (retransmissions included).
    pub packets_sent: u64,
    /// Packets received.
    pub packets_received: u64,
    /// Packets sent again after a `-`.
    pub retransmits: u64,
    /// Frames received with a bad checksum (answered with `-`).
    pub bad_frames: u64,
    /// Requests whose reply was waited for (round trips; resumes are not).
    pub round_trips: u64,
}

/// A connected, handshaken client of one GDB stub.
#[derive(Debug)]
pub struct GdbClient {
    stream: Stream,
    name: String,
    decoder: Decoder,
    ack_mode: bool,
    features: Features,
    regmap: RegisterMap,
    multiprocess: bool,
    queued: VecDeque<Vec<u8>>,
    pending_stops: VecDeque<StopReply>,
    console: Vec<u8>,
    reg_thread: Option<ThreadRef>,
    timeout: Duration,
    closed: bool,
    stats: ClientStats,
    phys_mode: bool,
    /// A read interrupted by a signal ends the wait (see
    /// [`GdbClient::wait_stop_interruptible`]).
    interruptible: bool,
    /// `HOTPROBE_RSP_LOG=FILE`: every byte sent and received, timestamped
    /// (debugging).
    log: Option<(std::fs::File, Instant)>,
}

/// The default time to wait for a reply to a request.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl GdbClient {
    /// Connects over TCP (`host:port`), sets TCP_NODELAY, and handshakes.
    pub fn connect_tcp(addr: &str, timeout: Duration) -> Result<Self, GdbError> {
        let err = |source| GdbError::Connect {
            addr: addr.to_string(),
            source,
        };
        let sa = addr
            .to_socket_addrs()
            .map_err(err)?
            .next()
            .ok_or_else(|| err(std::io::Error::other("address resolves to nothing")))?;
        let s = TcpStream::connect_timeout(&sa, timeout).map_err(err)?;
        s.set_nodelay(true).map_err(err)?;
        Self::handshake(Stream::Tcp(s), addr.to_string(), timeout)
    }

    /// Connects to a unix-domain socket stub and handshakes. A socket that
    /// refuses at first is tried again for up to `timeout`: the stub's
    /// file exists from its `bind`, and it accepts only from its `listen`
    /// on (a QEMU just started: `Connection refused` in 1 CI run).
    pub fn connect_unix(path: &Path, timeout: Duration) -> Result<Self, GdbError> {
        let t0 = std::time::Instant::now();
        let s = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e)
                    if e.kind() == std::io::ErrorKind::ConnectionRefused
                        && t0.elapsed() < timeout =>
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(source) => {
                    return Err(GdbError::Connect {
                        addr: path.display().to_string(),
                        source,
                    })
                }
            }
        };
        Self::handshake(Stream::Unix(s), path.display().to_string(), timeout)
    }

    /// Handshakes over an already connected stream: `qSupported`
    /// (multiprocess+), `QStartNoAckMode` if the stub has it, `target.xml`,
    /// and `?` (the current stop; the VM is stopped once a client connects).
    pub fn handshake(stream: Stream, name: String, timeout: Duration) -> Result<Self, GdbError> {
        let mut c = GdbClient {
            stream,
            name,
            decoder: Decoder::new(),
            ack_mode: true,
            features: Features::default(),
            regmap: RegisterMap::qemu_x86_64(),
            multiprocess: false,
            queued: VecDeque::new(),
            pending_stops: VecDeque::new(),
            console: Vec::new(),
            reg_thread: None,
            timeout,
            closed: false,
            stats: ClientStats::default(),
            phys_mode: false,
            interruptible: false,
            log: std::env::var_os("HOTPROBE_RSP_LOG").and_then(|p| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .ok()
                    .map(|f| (f, Instant::now()))
            }),
        };
        // Some stubs (QEMU before 8) announce the stop they made on connect
        // with an unsolicited stop reply: take it now, or every reply after
        // it would be off by one.
        c.drain(Duration::from_millis(100))?;
        let sup = c.request(
            "qSupported:multiprocess+;swbreak+;hwbreak+;vContSupported+;xmlRegisters=i386",
        )?;
        c.features = Features::parse(&sup);
        c.multiprocess = c.features.has("multiprocess");
        if c.features.has("QStartNoAckMode") {
            if let Ok(r) = c.request("QStartNoAckMode") {
                if r == b"OK" {
                    c.ack_mode = false;
                }
            }
        } else {
            // Try anyway: a stub may support it without saying so. QEMU 10
            // answers empty (no no-ack mode) and acks stay on.
            let r = c.request("QStartNoAckMode")?;
            if r == b"OK" {
                c.ack_mode = false;
            }
        }
        if c.features.has("qXfer:features:read") {
            // Reading target.xml also makes QEMU answer p/P.
            let top = c.read_feature("target.xml")?;
            let doc = rsp::parse_target_doc(&top);
            let mut regs = doc.regs;
            for inc in doc.includes {
                let sub = c.read_feature(&inc)?;
                regs.extend(rsp::parse_target_doc(&sub).regs);
            }
            if !regs.is_empty() {
                c.regmap = RegisterMap::from_regs(regs);
            }
        }
        Ok(c)
    }

    /// The stub's name (address or socket path).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The features the stub announced.
    pub fn features(&self) -> &Features {
        &self.features
    }

    /// The register layout in use (from `target.xml`, else QEMU's x86-64).
    pub fn register_map(&self) -> &RegisterMap {
        &self.regmap
    }

    /// Whether packets are still acknowledged (`QStartNoAckMode` refused).
    pub fn ack_mode(&self) -> bool {
        self.ack_mode
    }

    /// Wire counters.
    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// Console output the stub sent in `O` packets so far (taken).
    pub fn take_console(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.console)
    }

    /// The time each request waits for its reply.
    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    fn closed_err(&self) -> GdbError {
        GdbError::Closed {
            stub: self.name.clone(),
        }
    }

    fn log_bytes(&mut self, dir: &str, bytes: &[u8]) {
        if let Some((f, t0)) = self.log.as_mut() {
            let _ = writeln!(
                f,
                "{:>12.6} {dir} {}",
                t0.elapsed().as_secs_f64(),
                bytes.escape_ascii()
            );
        }
    }

    fn write_raw(&mut self, bytes: &[u8]) -> Result<(), GdbError> {
        if self.closed {
            return Err(self.closed_err());
        }
        self.log_bytes(">", bytes);
        self.stream.write_all(bytes).map_err(|source| {
            self.closed = true;
            if matches!(
                source.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ) {
                GdbError::Closed {
                    stub: self.name.clone(),
                }
            } else {
                GdbError::Io {
                    stub: self.name.clone(),
                    op: "write",
                    source,
                }
            }
        })
    }

    /// The next frame, or `Ok(None)` at the deadline.
    fn read_frame(&mut self, deadline: Instant) -> Result<Option<Frame>, GdbError> {
        loop {
            while let Some(f) = self.decoder.next_frame() {
                match f {
                    Ok(frame) => return Ok(Some(frame)),
                    Err(_) => {
                        self.stats.bad_frames += 1;
                        if self.ack_mode {
                            self.write_raw(b"-")?;
                        }
                    }
                }
            }
            if self.closed {
                return Err(self.closed_err());
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            if let Err(source) = self.stream.set_read_timeout(deadline - now) {
                return Err(GdbError::Io {
                    stub: self.name.clone(),
                    op: "set timeout",
                    source,
                });
            }
            let mut buf = [0u8; 16384];
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    self.closed = true;
                    return Err(self.closed_err());
                }
                Ok(n) => {
                    let got = buf.get(..n).unwrap_or_default();
                    self.log_bytes("<", got);
                    self.decoder.feed(got);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted && self.interruptible => {
                    return Ok(None);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    self.closed = true;
                    return Err(self.closed_err());
                }
                Err(source) => {
                    self.closed = true;
                    return Err(GdbError::Io {
                        stub: self.name.clone(),
                        op: "read",
                        source,
                    });
                }
            }
        }
    }

    /// The next packet (acked), or `Ok(None)` at the deadline.
    fn recv_packet(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>, GdbError> {
        if let Some(p) = self.queued.pop_front() {
            return Ok(Some(p));
        }
        loop {
            match self.read_frame(deadline)? {
                None => return Ok(None),
                Some(Frame::Packet(p)) => {
                    self.stats.packets_received += 1;
                    if self.ack_mode {
                        self.write_raw(b"+")?;
                    }
                    return Ok(Some(p));
                }
                Some(_) => continue,
            }
        }
    }

    /// Sends one packet, waiting for its `+` in ack mode (resending on `-`).
    pub fn send_packet(&mut self, payload: &[u8]) -> Result<(), GdbError> {
        let frame = rsp::encode_packet(payload);
        for attempt in 0..5 {
            if attempt > 0 {
                self.stats.retransmits += 1;
            }
            self.write_raw(&frame)?;
            self.stats.packets_sent += 1;
            if !self.ack_mode {
                return Ok(());
            }
            let deadline = Instant::now() + self.timeout;
            loop {
                match self.read_frame(deadline)? {
                    None => {
                        return Err(GdbError::Timeout {
                            stub: self.name.clone(),
                            what: format!("ack of {}", short(payload)),
                            after: self.timeout,
                        })
                    }
                    Some(Frame::Ack) => return Ok(()),
                    Some(Frame::Nack) => break,
                    Some(Frame::Packet(p)) => {
                        // A packet that crossed ours (a stop reply in flight).
                        self.stats.packets_received += 1;
                        self.write_raw(b"+")?;
                        self.queued.push_back(p);
                    }
                    Some(_) => {}
                }
            }
        }
        Err(GdbError::BadReply {
            stub: self.name.clone(),
            request: short(payload),
            why: "refused 5 times (bad checksum)".into(),
        })
    }

    /// Sends a request and returns its reply. Stop replies that arrive
    /// meanwhile are kept for [`GdbClient::wait_stop`]; `O` output goes to
    /// the console buffer; `W`/`X` becomes [`GdbError::Exited`].
    pub fn request(&mut self, payload: &str) -> Result<Vec<u8>, GdbError> {
        self.request_bytes(payload.as_bytes(), false)
    }

    fn request_bytes(&mut self, payload: &[u8], want_stop: bool) -> Result<Vec<u8>, GdbError> {
        self.send_packet(payload)?;
        self.stats.round_trips += 1;
        let deadline = Instant::now() + self.timeout;
        loop {
            let Some(p) = self.recv_packet(deadline)? else {
                return Err(GdbError::Timeout {
                    stub: self.name.clone(),
                    what: short(payload),
                    after: self.timeout,
                });
            };
            match StopReply::parse(&p) {
                Some(Ok(StopReply::Output(o))) => self.console.extend_from_slice(&o),
                Some(Ok(r @ (StopReply::Exited { .. } | StopReply::Terminated { .. }))) => {
                    self.closed = true;
                    return Err(GdbError::Exited {
                        stub: self.name.clone(),
                        reply: r,
                    });
                }
                Some(Ok(r)) if !want_stop => self.pending_stops.push_back(r),
                _ => return Ok(p),
            }
        }
    }

    /// A request whose reply must be `OK`.
    pub fn request_ok(&mut self, payload: &str) -> Result<(), GdbError> {
        let r = self.request(payload)?;
        self.check_ok(payload, &r)
    }

    fn check_ok(&self, payload: &str, r: &[u8]) -> Result<(), GdbError> {
        if r == b"OK" {
            Ok(())
        } else {
            Err(self.reply_error(payload, r))
        }
    }

    fn reply_error(&self, request: &str, r: &[u8]) -> GdbError {
        if r.is_empty() {
            GdbError::Unsupported {
                stub: self.name.clone(),
                request: short(request.as_bytes()),
            }
        } else if r.first() == Some(&b'E') {
            GdbError::ErrorReply {
                stub: self.name.clone(),
                request: short(request.as_bytes()),
                reply: String::from_utf8_lossy(r).into_owned(),
            }
        } else {
            GdbError::BadReply {
                stub: self.name.clone(),
                request: short(request.as_bytes()),
                why: format!("unexpected {:?}", short(r)),
            }
        }
    }

    /// Reads packets for `quiet`, keeping any stop reply for later.
    fn drain(&mut self, quiet: Duration) -> Result<(), GdbError> {
        let deadline = Instant::now() + quiet;
        while let Some(p) = self.recv_packet(deadline)? {
            match StopReply::parse(&p) {
                Some(Ok(StopReply::Output(o))) => self.console.extend_from_slice(&o),
                Some(Ok(r)) => self.pending_stops.push_back(r),
                _ => {}
            }
        }
        Ok(())
    }

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

    fn max_payload(&self) -> usize {
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

    fn tid(&self, t: ThreadRef) -> String {
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

fn short(p: &[u8]) -> String {
    let s = String::from_utf8_lossy(p);
    if s.chars().count() > 40 {
        format!("{}...", s.chars().take(40).collect::<String>())
    } else {
        s.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::thread;

    /// A scripted fake stub on a socket pair: replies to each packet received
    /// with the next scripted reply (acking everything).
    fn fake_stub(
        script: Vec<(&'static str, Vec<u8>)>,
        extra_first: Vec<u8>,
    ) -> (UnixStream, thread::JoinHandle<()>) {
        let (a, mut b) = UnixStream::pair().unwrap();
        let h = thread::spawn(move || {
            b.write_all(&extra_first).unwrap();
            let mut d = Decoder::new();
            let mut script = script.into_iter();
            let mut buf = [0u8; 4096];
            loop {
                let n = match b.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                d.feed(&buf[..n]);
                while let Some(f) = d.next_frame() {
                    if let Ok(Frame::Packet(p)) = f {
                        b.write_all(b"+").unwrap();
                        let Some((want, reply)) = script.next() else {
                            return;
                        };
                        assert!(
                            String::from_utf8_lossy(&p).starts_with(want),
                            "fake stub expected {want:?}, got {:?}",
                            String::from_utf8_lossy(&p)
                        );
                        if reply == b"CLOSE" {
                            return;
                        }
                        b.write_all(&reply).unwrap();
                    }
                }
            }
        });
        (a, h)
    }

    fn pkt(s: &str) -> Vec<u8> {
        rsp::encode_packet(s.as_bytes())
    }

    fn handshake_script() -> Vec<(&'static str, Vec<u8>)> {
        vec![
            (
                "qSupported",
                pkt("PacketSize=1000;qXfer:features:read+;vContSupported+;multiprocess+"),
            ),
            ("QStartNoAckMode", pkt("")),
            (
                "qXfer:features:read:target.xml",
                pkt(
                    r#"l<target><architecture>i386:x86-64</architecture><xi:include href="i386-64bit.xml"/></target>"#,
                ),
            ),
            (
                "qXfer:features:read:i386-64bit.xml",
                pkt(&format!(
                    "l{}",
                    include_str!("../tests/data/i386-64bit.xml")
                )),
            ),
        ]
    }

    #[test]
    fn trap_stop_selects_its_thread_and_cont_at_moves_it() {
        let mut script = handshake_script();
        script.push(("c", pkt("T05thread:p01.02;")));
        // the trap stop selected p1.2 for registers: no Hg before p
        script.push(("p10", pkt("eb92a581ffffffff")));
        script.push(("cffffffff81000010", pkt("T02thread:p01.01;")));
        // an interrupt stop does not select its thread
        script.push(("Hgp1.1", pkt("OK")));
        script.push(("p10", pkt("1000008100000000")));
        let (a, h) = fake_stub(script, Vec::new());
        let mut c =
            GdbClient::handshake(Stream::Unix(a), "fake".into(), Duration::from_secs(5)).unwrap();
        c.cont_at(0).ok();
        let stop = c.wait_stop(Some(Duration::from_secs(5))).unwrap().unwrap();
        assert!(matches!(stop, StopReply::Signal { signal: 5, .. }));
        let trips = c.stats().round_trips;
        let t2 = ThreadRef {
            pid: Some(1),
            tid: 2,
        };
        let rip = c.read_register(t2, 16).unwrap();
        assert_eq!(
            u64::from_le_bytes(rip.try_into().unwrap()),
            0xffffffff81a592eb
        );
        assert_eq!(c.stats().round_trips, trips + 1, "p alone");
        c.cont_at(0xffffffff81000010).unwrap();
        let stop = c.wait_stop(Some(Duration::from_secs(5))).unwrap().unwrap();
        assert!(matches!(stop, StopReply::Signal { signal: 2, .. }));
        let t1 = ThreadRef {
            pid: Some(1),
            tid: 1,
        };
        c.read_register(t1, 16).unwrap();
        assert_eq!(c.stats().round_trips, trips + 3, "Hg and p");
        drop(c);
        h.join().unwrap();
    }

    #[test]
    fn handshake_unsolicited_stop_and_requests() {
        let mut script = handshake_script();
        script.push(("?", pkt("T05thread:p01.01;")));
        script.push(("qfThreadInfo", pkt("mp01.01,p01.02")));
        script.push(("qsThreadInfo", pkt("l")));
        script.push(("Hgp1.2", pkt("OK")));
        script.push(("p10", pkt("eb92a581ffffffff")));
        script.push(("m1000,4", pkt("E14")));
        script.push(("vCont;c", pkt("O6869")));
        script.push(("Z0,ffffffff810be3a0,1", pkt("OK")));
        script.push(("D;1", pkt("OK")));
        // an unsolicited stop reply before anything was asked
        let (a, h) = fake_stub(script, pkt("T02thread:p01.01;"));
        let mut c =
            GdbClient::handshake(Stream::Unix(a), "fake".into(), Duration::from_secs(5)).unwrap();
        assert!(c.ack_mode());
        assert_eq!(c.register_map().g_len(), 608);
        // the unsolicited one was kept, and ? answers the real one
        assert_eq!(
            c.query_stop().unwrap(),
            StopReply::parse(b"T05thread:p01.01;").unwrap().unwrap()
        );
        assert_eq!(c.threads().unwrap().len(), 2);
        let rip = c
            .read_register(
                ThreadRef {
                    pid: Some(1),
                    tid: 2,
                },
                16,
            )
            .unwrap();
        assert_eq!(
            u64::from_le_bytes(rip.try_into().unwrap()),
            0xffffffff81a592eb
        );
        let mut b = [0u8; 4];
        assert!(matches!(
            c.read_memory(0x1000, &mut b),
            Err(GdbError::ErrorReply { .. })
        ));
        c.cont().unwrap();
        // the O packet is console output, not a stop; then nothing: timeout
        assert_eq!(c.wait_stop(Some(Duration::from_millis(200))).unwrap(), None);
        assert_eq!(c.take_console(), b"hi");
        // an interrupt is one raw byte; the fake ignores it
        c.interrupt().unwrap();
        c.insert_breakpoint(0, 0xffffffff810be3a0).unwrap();
        c.detach().unwrap();
        h.join().unwrap();
    }

    #[test]
    fn closed_connection_and_exit_are_errors_not_hangs() {
        let mut script = handshake_script();
        script.push(("Hg", pkt("OK")));
        script.push(("g", b"CLOSE".to_vec()));
        let (a, h) = fake_stub(script, vec![]);
        let mut c =
            GdbClient::handshake(Stream::Unix(a), "fake".into(), Duration::from_secs(5)).unwrap();
        let e = c
            .read_g(ThreadRef {
                pid: Some(1),
                tid: 1,
            })
            .unwrap_err();
        assert!(e.is_fatal(), "{e}");
        h.join().unwrap();
        assert!(c.wait_stop(Some(Duration::from_millis(10))).is_err());

        let mut script = handshake_script();
        script.push(("m", pkt("W00")));
        let (a, h) = fake_stub(script, vec![]);
        let mut c =
            GdbClient::handshake(Stream::Unix(a), "fake".into(), Duration::from_secs(5)).unwrap();
        let mut b = [0u8; 1];
        assert!(matches!(
            c.read_memory(0, &mut b),
            Err(GdbError::Exited { .. })
        ));
        assert!(c.is_closed());
        drop(c);
        h.join().unwrap();
    }

    #[test]
    fn silent_stub_times_out() {
        let (a, _b) = UnixStream::pair().unwrap();
        let t0 = Instant::now();
        let e = GdbClient::handshake(Stream::Unix(a), "silent".into(), Duration::from_millis(300))
            .unwrap_err();
        assert!(matches!(e, GdbError::Timeout { .. }), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn bad_checksum_gets_nack_and_retry() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let h = thread::spawn(move || {
            let mut d = Decoder::new();
            let mut buf = [0u8; 4096];
            let mut got = Vec::new();
            let mut sent_bad = false;
            loop {
                let n = match b.read(&mut buf) {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => n,
                };
                d.feed(&buf[..n]);
                while let Some(f) = d.next_frame() {
                    got.push(f.clone());
                    if let Ok(Frame::Packet(p)) = f {
                        b.write_all(b"+").unwrap();
                        if p.starts_with(b"qSupported") {
                            if !sent_bad {
                                sent_bad = true;
                                b.write_all(b"$PacketSize=1000#00").unwrap();
                            }
                        } else if p == b"QStartNoAckMode" {
                            b.write_all(&pkt("OK")).unwrap();
                        }
                    } else if let Ok(Frame::Nack) = f {
                        b.write_all(&pkt("PacketSize=1000")).unwrap();
                    }
                }
            }
        });
        let c =
            GdbClient::handshake(Stream::Unix(a), "fake".into(), Duration::from_secs(5)).unwrap();
        assert!(!c.ack_mode());
        assert_eq!(c.features().packet_size, Some(0x1000));
        assert_eq!(c.stats().bad_frames, 1);
        drop(c);
        let frames = h.join().unwrap();
        assert!(frames.contains(&Ok(Frame::Nack)));
    }
}
