//! The wire under the client: raw writes, frames and acks, requests and replies.

use super::*;

impl GdbClient {
    pub(super) fn closed_err(&self) -> GdbError {
        GdbError::Closed {
            stub: self.name.clone(),
        }
    }

    pub(super) fn log_bytes(&mut self, dir: &str, bytes: &[u8]) {
        if let Some((f, t0)) = self.log.as_mut() {
            let _ = writeln!(
                f,
                "{:>12.6} {dir} {}",
                t0.elapsed().as_secs_f64(),
                bytes.escape_ascii()
            );
        }
    }

    pub(super) fn write_raw(&mut self, bytes: &[u8]) -> Result<(), GdbError> {
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
    pub(super) fn read_frame(&mut self, deadline: Instant) -> Result<Option<Frame>, GdbError> {
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
    pub(super) fn recv_packet(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>, GdbError> {
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

    pub(super) fn request_bytes(
        &mut self,
        payload: &[u8],
        want_stop: bool,
    ) -> Result<Vec<u8>, GdbError> {
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

    pub(super) fn check_ok(&self, payload: &str, r: &[u8]) -> Result<(), GdbError> {
        if r == b"OK" {
            Ok(())
        } else {
            Err(self.reply_error(payload, r))
        }
    }

    pub(super) fn reply_error(&self, request: &str, r: &[u8]) -> GdbError {
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
    pub(super) fn drain(&mut self, quiet: Duration) -> Result<(), GdbError> {
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
}

fn short(p: &[u8]) -> String {
    let s = String::from_utf8_lossy(p);
    if s.chars().count() > 40 {
        format!("{}...", s.chars().take(40).collect::<String>())
    } else {
        s.into_owned()
    }
}
