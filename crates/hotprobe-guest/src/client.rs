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

mod commands;
mod wire;

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
