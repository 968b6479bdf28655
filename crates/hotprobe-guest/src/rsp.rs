//! A pure GDB Remote Serial Protocol codec: packet framing and checksums,
//! escaping and run-length decoding, a streaming decoder that never panics on
//! bad bytes, and parsers for the replies a probing client needs (stop
//! replies, `qSupported`, thread lists, register blocks described by
//! `target.xml`, hex memory).
//!
//! Nothing here does I/O; [`crate::client`] drives it over a socket.

use hotprobe_target::Registers;

mod reply;
pub use reply::*;
mod regs;
pub use regs::*;

/// The largest packet payload (as sent, before unescaping) the decoder
/// accepts; longer frames are reported as [`DecodeError::TooLong`] and skipped.
pub const MAX_PACKET: usize = 1 << 20;

/// Something the decoder failed to make sense of. The decoder skips the bad
/// bytes and goes on with the next frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The checksum after `#` does not match the payload.
    #[error("bad checksum: computed {computed:#04x}, packet says {sent:#04x}")]
    Checksum {
        /// The checksum of the bytes received.
        computed: u8,
        /// The checksum the sender wrote.
        sent: u8,
    },
    /// The two characters after `#` are not hex digits.
    #[error("checksum characters are not hex: {0:?}")]
    ChecksumNotHex([u8; 2]),
    /// A frame was longer than [`MAX_PACKET`].
    #[error("packet longer than {MAX_PACKET} bytes")]
    TooLong,
    /// A `*` run-length marker with nothing before it or a bad count.
    #[error("bad run-length encoding at payload byte {0}")]
    RunLength(usize),
    /// A `}` escape as the last byte of the payload.
    #[error("escape character at the end of the payload")]
    DanglingEscape,
    /// A `$` started a new packet before the previous one ended.
    #[error("packet interrupted by a new '$' after {0} bytes")]
    Interrupted(usize),
}

/// One thing read from the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// `+`: the last packet sent arrived intact.
    Ack,
    /// `-`: the last packet sent must be sent again.
    Nack,
    /// A raw 0x03 byte (an interrupt request; only a stub receives these).
    Interrupt,
    /// `$payload#cs`, checksum verified, unescaped and run-length expanded.
    Packet(Vec<u8>),
    /// `%payload#cs`, a non-stop notification.
    Notification(Vec<u8>),
}

/// The modulo-256 sum of the bytes, the RSP checksum.
pub fn checksum(data: &[u8]) -> u8 {
    data.iter().fold(0u8, |acc, b| acc.wrapping_add(*b))
}

/// Frames `payload` as `$payload#cs`, escaping `$`, `#`, `}` and `*`.
pub fn encode_packet(payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(payload.len() + 4);
    for &b in payload {
        if matches!(b, b'$' | b'#' | b'}' | b'*') {
            body.push(b'}');
            body.push(b ^ 0x20);
        } else {
            body.push(b);
        }
    }
    let cs = checksum(&body);
    let mut out = Vec::with_capacity(body.len() + 4);
    out.push(b'$');
    out.extend_from_slice(&body);
    out.push(b'#');
    out.extend_from_slice(format!("{cs:02x}").as_bytes());
    out
}

/// Unescapes (`}` x → x ^ 0x20) and expands run-length encoding (`c*n`: `c`
/// repeated `n - 29` more times) of a payload as received.
pub fn unescape(raw: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let mut out: Vec<u8> = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        match b {
            b'}' => {
                let next = *raw.get(i + 1).ok_or(DecodeError::DanglingEscape)?;
                out.push(next ^ 0x20);
                i += 2;
            }
            b'*' => {
                let count = *raw.get(i + 1).ok_or(DecodeError::RunLength(i))?;
                let last = *out.last().ok_or(DecodeError::RunLength(i))?;
                if !(29..=126).contains(&count) {
                    return Err(DecodeError::RunLength(i));
                }
                let repeat = usize::from(count - 29);
                if out.len() + repeat > MAX_PACKET * 4 {
                    return Err(DecodeError::TooLong);
                }
                out.extend(std::iter::repeat_n(last, repeat));
                i += 2;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(out)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Idle,
    Body { notification: bool },
    Escaped { notification: bool },
    Check1 { notification: bool },
    Check2 { notification: bool, hi: u8 },
}

/// A streaming decoder: feed it byte chunks as they arrive (split anywhere),
/// take frames out. Bytes outside frames that are not `+`, `-` or 0x03 are
/// skipped (counted in [`Decoder::skipped`]).
#[derive(Debug)]
pub struct Decoder {
    state: State,
    raw: Vec<u8>,
    out: std::collections::VecDeque<Result<Frame, DecodeError>>,
    skipped: u64,
    too_long: bool,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

impl Decoder {
    /// A decoder waiting for the first frame.
    pub fn new() -> Self {
        Decoder {
            state: State::Idle,
            raw: Vec::new(),
            out: std::collections::VecDeque::new(),
            skipped: 0,
            too_long: false,
        }
    }

    /// How many stray bytes outside frames were skipped so far.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Whether the decoder is in the middle of a frame.
    pub fn in_frame(&self) -> bool {
        self.state != State::Idle
    }

    /// Feeds received bytes; decoded frames and errors queue up for
    /// [`Decoder::next_frame`].
    pub fn feed(&mut self, chunk: &[u8]) {
        for &b in chunk {
            self.byte(b);
        }
    }

    /// The next decoded frame or error, if any is complete.
    pub fn next_frame(&mut self) -> Option<Result<Frame, DecodeError>> {
        self.out.pop_front()
    }

    fn start(&mut self, notification: bool) {
        self.raw.clear();
        self.too_long = false;
        self.state = State::Body { notification };
    }

    fn push_raw(&mut self, b: u8) {
        if self.raw.len() < MAX_PACKET {
            self.raw.push(b);
        } else {
            self.too_long = true;
        }
    }

    fn byte(&mut self, b: u8) {
        match self.state {
            State::Idle => match b {
                b'$' => self.start(false),
                b'%' => self.start(true),
                b'+' => self.out.push_back(Ok(Frame::Ack)),
                b'-' => self.out.push_back(Ok(Frame::Nack)),
                0x03 => self.out.push_back(Ok(Frame::Interrupt)),
                _ => self.skipped += 1,
            },
            State::Body { notification } => match b {
                b'#' => self.state = State::Check1 { notification },
                b'$' => {
                    // A sender that restarts a packet: report and resync on it.
                    self.out
                        .push_back(Err(DecodeError::Interrupted(self.raw.len())));
                    self.start(false);
                }
                b'}' => {
                    self.push_raw(b);
                    self.state = State::Escaped { notification };
                }
                _ => self.push_raw(b),
            },
            State::Escaped { notification } => {
                // Any byte (even '#' or '$') is data after an escape.
                self.push_raw(b);
                self.state = State::Body { notification };
            }
            State::Check1 { notification } => {
                self.state = State::Check2 {
                    notification,
                    hi: b,
                };
            }
            State::Check2 { notification, hi } => {
                self.state = State::Idle;
                let raw = std::mem::take(&mut self.raw);
                let result = self.finish(notification, hi, b, &raw);
                self.raw = raw;
                self.raw.clear();
                self.out.push_back(result);
            }
        }
    }

    fn finish(&self, notification: bool, hi: u8, lo: u8, raw: &[u8]) -> Result<Frame, DecodeError> {
        if self.too_long {
            return Err(DecodeError::TooLong);
        }
        let sent = match (hex_val(hi), hex_val(lo)) {
            (Some(h), Some(l)) => (h << 4) | l,
            _ => return Err(DecodeError::ChecksumNotHex([hi, lo])),
        };
        let computed = checksum(raw);
        if computed != sent {
            return Err(DecodeError::Checksum { computed, sent });
        }
        let payload = unescape(raw)?;
        Ok(if notification {
            Frame::Notification(payload)
        } else {
            Frame::Packet(payload)
        })
    }
}

/// A reply that could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse {what} from {text:?}")]
pub struct ParseError {
    /// What was being parsed.
    pub what: &'static str,
    /// The offending text (lossy, cut to 80 characters).
    pub text: String,
}

impl ParseError {
    fn new(what: &'static str, data: &[u8]) -> Self {
        let text: String = String::from_utf8_lossy(data).chars().take(80).collect();
        ParseError { what, text }
    }
}

/// Decodes a hex string into bytes.
pub fn decode_hex(hex: &[u8]) -> Result<Vec<u8>, ParseError> {
    if !hex.len().is_multiple_of(2) {
        return Err(ParseError::new("hex bytes (odd length)", hex));
    }
    hex.chunks_exact(2)
        .map(|p| match (hex_val(p[0]), hex_val(p[1])) {
            (Some(h), Some(l)) => Ok((h << 4) | l),
            _ => Err(ParseError::new("hex bytes", hex)),
        })
        .collect()
}

/// Encodes bytes as lower-case hex.
pub fn encode_hex(data: &[u8]) -> String {
    let mut s = String::with_capacity(data.len() * 2);
    for b in data {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Parses a big-endian hex number (as in `W1f`, `p1.a`, thread ids).
pub fn parse_hex_u64(text: &[u8]) -> Result<u64, ParseError> {
    if text.is_empty() || text.len() > 16 {
        return Err(ParseError::new("hex number", text));
    }
    text.iter().try_fold(0u64, |acc, &b| {
        hex_val(b)
            .map(|v| (acc << 4) | u64::from(v))
            .ok_or_else(|| ParseError::new("hex number", text))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(chunks: &[&[u8]]) -> Vec<Result<Frame, DecodeError>> {
        let mut d = Decoder::new();
        let mut out = Vec::new();
        for c in chunks {
            d.feed(c);
            while let Some(f) = d.next_frame() {
                out.push(f);
            }
        }
        out
    }

    #[test]
    fn checksums() {
        for (data, cs) in [
            (&b""[..], 0u8),
            (b"OK", 0x9a),
            (b"qC", 0xb4),
            (b"mp01.01", 0xcd),
            (b"T05thread:p01.01;", 0x06),
        ] {
            assert_eq!(checksum(data), cs, "{data:?}");
        }
    }

    #[test]
    fn encode_escapes() {
        let table: &[(&[u8], &[u8])] = &[
            (b"OK", b"$OK#9a"),
            (b"", b"$#00"),
            (b"a}b", b"$a}]b#"),
            (b"$#*", b"$}\x04}\x03}\x0a#"),
        ];
        for (payload, prefix) in table {
            let enc = encode_packet(payload);
            assert!(
                enc.starts_with(prefix),
                "{payload:?} -> {:?}",
                String::from_utf8_lossy(&enc)
            );
            let got = decode_all(&[&enc]);
            assert_eq!(got, vec![Ok(Frame::Packet(payload.to_vec()))]);
        }
    }

    #[test]
    fn decoder_table() {
        type Case<'a> = (&'a [&'a [u8]], Vec<Result<Frame, DecodeError>>);
        let cases: Vec<Case> = vec![
            (
                &[b"+$OK#9a"],
                vec![Ok(Frame::Ack), Ok(Frame::Packet(b"OK".to_vec()))],
            ),
            (
                &[b"+$O", b"K#", b"9", b"a-"],
                vec![
                    Ok(Frame::Ack),
                    Ok(Frame::Packet(b"OK".to_vec())),
                    Ok(Frame::Nack),
                ],
            ),
            (&[b"$OK#9A"], vec![Ok(Frame::Packet(b"OK".to_vec()))]),
            (
                &[b"$OK#00"],
                vec![Err(DecodeError::Checksum {
                    computed: 0x9a,
                    sent: 0,
                })],
            ),
            (
                &[b"$OK#zz$OK#9a"],
                vec![
                    Err(DecodeError::ChecksumNotHex(*b"zz")),
                    Ok(Frame::Packet(b"OK".to_vec())),
                ],
            ),
            (
                &[b"junk\x03$OK#9a"],
                vec![Ok(Frame::Interrupt), Ok(Frame::Packet(b"OK".to_vec()))],
            ),
            (&[b"$0* #"], vec![]),
            // run-length: "0* " = '0' + 3 more
            (
                &[b"$0* #", b"7a"],
                vec![Ok(Frame::Packet(b"0000".to_vec()))],
            ),
            (&[b"%Stop:T05#"], vec![]),
            (
                &[b"$O$OK#9a"],
                vec![
                    Err(DecodeError::Interrupted(1)),
                    Ok(Frame::Packet(b"OK".to_vec())),
                ],
            ),
            (&[b"$*!#4b"], vec![Err(DecodeError::RunLength(0))]),
            // '}' escapes the '#': payload "}#" is byte 0x03
            (&[b"$}#", b"#a0"], vec![Ok(Frame::Packet(vec![3]))]),
        ];
        for (chunks, want) in cases {
            assert_eq!(decode_all(chunks), want, "{chunks:?}");
        }
        // notification
        let n = encode_packet(b"Stop:T05");
        let mut n = n.clone();
        n[0] = b'%';
        assert_eq!(
            decode_all(&[&n]),
            vec![Ok(Frame::Notification(b"Stop:T05".to_vec()))]
        );
    }

    #[test]
    fn decoder_survives_every_split_and_garbage() {
        let stream: Vec<u8> = [
            &b"+"[..],
            &encode_packet(b"T05thread:p01.01;"),
            b"\xff\x00garbage",
            &encode_packet(&[b'}', b'*', b'#', 0, 255]),
            b"$broken#qq",
        ]
        .concat();
        for split in 0..stream.len() {
            let (a, b) = stream.split_at(split);
            let got = decode_all(&[a, b]);
            assert_eq!(got.len(), 4, "split {split}: {got:?}");
            assert_eq!(got[0], Ok(Frame::Ack));
            assert_eq!(got[1], Ok(Frame::Packet(b"T05thread:p01.01;".to_vec())));
            assert_eq!(got[2], Ok(Frame::Packet(vec![b'}', b'*', b'#', 0, 255])));
            assert!(got[3].is_err());
        }
    }

    #[test]
    fn unescape_errors() {
        assert_eq!(unescape(b"a}"), Err(DecodeError::DanglingEscape));
        assert_eq!(unescape(b"a*"), Err(DecodeError::RunLength(1)));
        assert_eq!(unescape(b"a*\x10"), Err(DecodeError::RunLength(1)));
        assert_eq!(unescape(b"a*~").unwrap().len(), 1 + 126 - 29);
    }

    #[test]
    fn too_long_frames_are_dropped() {
        let mut d = Decoder::new();
        d.feed(b"$");
        d.feed(&vec![b'a'; MAX_PACKET + 10]);
        d.feed(b"#00$OK#9a");
        assert_eq!(d.next_frame(), Some(Err(DecodeError::TooLong)));
        assert_eq!(d.next_frame(), Some(Ok(Frame::Packet(b"OK".to_vec()))));
    }

    #[test]
    fn stop_replies() {
        let t = |tid| Some(ThreadRef { pid: Some(1), tid });
        let table: Vec<(&[u8], Option<StopReply>)> = vec![
            (
                b"T05thread:p01.01;",
                Some(StopReply::Signal {
                    signal: 5,
                    thread: t(1),
                    pairs: vec![],
                }),
            ),
            (
                b"T02thread:p1.2;swbreak:;",
                Some(StopReply::Signal {
                    signal: 2,
                    thread: t(2),
                    pairs: vec![("swbreak".into(), "".into())],
                }),
            ),
            (
                b"S05",
                Some(StopReply::Signal {
                    signal: 5,
                    thread: None,
                    pairs: vec![],
                }),
            ),
            (b"W00", Some(StopReply::Exited { code: 0 })),
            (b"W1f;process:1", Some(StopReply::Exited { code: 0x1f })),
            (b"X09", Some(StopReply::Terminated { signal: 9 })),
            (b"O68690a", Some(StopReply::Output(b"hi\n".to_vec()))),
            (b"OK", None),
            (b"E01", None),
            (b"", None),
        ];
        for (p, want) in table {
            assert_eq!(
                StopReply::parse(p).map(|r| r.unwrap()),
                want,
                "{:?}",
                String::from_utf8_lossy(p)
            );
        }
        for bad in [&b"T"[..], b"Tzz", b"T05thread:pzz.1;", b"W", b"Oxyz", b"S0"] {
            assert!(
                matches!(StopReply::parse(bad), Some(Err(_)) | None),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn thread_refs_and_lists() {
        assert_eq!(
            ThreadRef::parse(b"p01.02").unwrap(),
            ThreadRef {
                pid: Some(1),
                tid: 2
            }
        );
        assert_eq!(
            ThreadRef::parse(b"p1.-1").unwrap(),
            ThreadRef {
                pid: Some(1),
                tid: -1
            }
        );
        assert_eq!(
            ThreadRef::parse(b"-1").unwrap(),
            ThreadRef { pid: None, tid: -1 }
        );
        assert_eq!(
            ThreadRef::parse(b"1a").unwrap(),
            ThreadRef { pid: None, tid: 26 }
        );
        assert_eq!(
            ThreadRef {
                pid: Some(1),
                tid: 10
            }
            .encode(),
            "p1.a"
        );
        assert_eq!(
            ThreadRef {
                pid: Some(1),
                tid: -1
            }
            .encode(),
            "p1.-1"
        );
        let (ts, done) = parse_thread_list(b"mp01.01,p01.02").unwrap();
        assert_eq!(ts.len(), 2);
        assert!(!done);
        assert_eq!(parse_thread_list(b"l").unwrap(), (vec![], true));
        assert!(parse_thread_list(b"E01").is_err());
    }

    #[test]
    fn supported_features() {
        let f = Features::parse(b"PacketSize=1000;qXfer:features:read+;vContSupported+;multiprocess+;QStartNoAckMode-;x=y");
        assert_eq!(f.packet_size, Some(0x1000));
        assert!(f.has("multiprocess") && f.has("qXfer:features:read") && !f.has("QStartNoAckMode"));
        assert_eq!(f.unsupported, vec!["QStartNoAckMode".to_string()]);
        assert_eq!(f.values, vec![("x".to_string(), "y".to_string())]);
    }

    #[test]
    fn hex_helpers() {
        assert_eq!(decode_hex(b"00ff7A").unwrap(), vec![0, 255, 0x7a]);
        assert!(decode_hex(b"0").is_err());
        assert!(decode_hex(b"0g").is_err());
        assert_eq!(encode_hex(&[0xde, 0xad, 1]), "dead01");
        assert_eq!(
            parse_hex_u64(b"ffffffff810be3a0").unwrap(),
            0xffffffff810be3a0
        );
        assert!(parse_hex_u64(b"").is_err());
        assert!(parse_hex_u64(b"11112222333344445").is_err());
    }

    const QEMU_XML: &str = include_str!("../tests/data/i386-64bit.xml");

    #[test]
    fn qemu_target_xml_matches_builtin_layout() {
        let top = parse_target_doc(
            r#"<?xml version="1.0"?><!DOCTYPE target SYSTEM "gdb-target.dtd"><target><architecture>i386:x86-64</architecture><xi:include href="i386-64bit.xml"/></target>"#,
        );
        assert_eq!(top.architecture.as_deref(), Some("i386:x86-64"));
        assert_eq!(top.includes, vec!["i386-64bit.xml".to_string()]);
        let doc = parse_target_doc(QEMU_XML);
        let map = RegisterMap::from_regs(doc.regs);
        // The commented-out cs/ss/ds/es_base registers are not registers.
        assert!(map.get("ss_base").is_none());
        assert_eq!(map.g_len(), 608);
        assert_eq!(map.get("cr3").unwrap().offset, 204);
        assert_eq!(map.get("rip").unwrap().regnum, 16);
        assert_eq!(map, RegisterMap::qemu_x86_64());
    }

    #[test]
    fn registers_round_trip_through_g_block() {
        let map = RegisterMap::qemu_x86_64();
        let mut g = vec![0u8; map.g_len()];
        let mut regs = Registers::default();
        for (v, (name, slot)) in (1u64..).zip(RegisterMap::fields(&mut regs)) {
            // 32-bit registers keep 32 bits
            let bits = map.get(name).unwrap().bitsize;
            *slot = if bits == 32 {
                v & 0xffff_ffff
            } else {
                v.wrapping_mul(0x0101_0101_0101)
            };
        }
        map.store(&mut g, &regs);
        assert_eq!(map.registers(&g), regs);
        assert_eq!(
            u64::from_le_bytes(g[204..212].try_into().unwrap()),
            regs.cr3
        );
        // short blocks give zeros, never panic
        let short = map.registers(&g[..100]);
        assert_eq!(short.rip, 0);
        assert_eq!(short.rax, regs.rax);
    }

    #[test]
    fn xml_attr_edge_cases() {
        assert_eq!(
            xml_attr(r#" name="a" regnum='3'"#, "regnum").as_deref(),
            Some("3")
        );
        assert_eq!(
            xml_attr(r#" xname="a" name="b""#, "name").as_deref(),
            Some("b")
        );
        assert_eq!(xml_attr(r#" name=a"#, "name"), None);
        assert_eq!(xml_attr(r#" name="a"#, "name"), None);
        assert_eq!(strip_xml_comments("a<!--b-->c<!--d"), "ac");
    }
}
