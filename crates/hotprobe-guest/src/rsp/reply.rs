//! Parsers of the replies a client reads: thread ids, stop replies,
//! `qSupported` features, thread lists.

use super::*;

/// A thread id as the protocol writes it: `p<pid>.<tid>` with multiprocess
/// extensions, `<tid>` without; `-1` means all, `0` any.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ThreadRef {
    /// The process (always 1 for QEMU's single-process view), if given.
    pub pid: Option<i64>,
    /// The thread (for QEMU: the vCPU index + 1).
    pub tid: i64,
}

fn parse_id(text: &[u8]) -> Result<i64, ParseError> {
    if text == b"-1" {
        Ok(-1)
    } else {
        parse_hex_u64(text).map(|v| v as i64)
    }
}

impl ThreadRef {
    /// Parses `p1.2`, `p01.01`, `2`, `-1`.
    pub fn parse(text: &[u8]) -> Result<Self, ParseError> {
        if let Some(rest) = text.strip_prefix(b"p") {
            let mut parts = rest.splitn(2, |&b| b == b'.');
            let pid = parse_id(parts.next().unwrap_or_default())?;
            let tid = match parts.next() {
                Some(t) => parse_id(t)?,
                None => -1,
            };
            Ok(ThreadRef {
                pid: Some(pid),
                tid,
            })
        } else {
            Ok(ThreadRef {
                pid: None,
                tid: parse_id(text)?,
            })
        }
    }

    /// Writes it back in protocol form (multiprocess form when `pid` is set).
    pub fn encode(&self) -> String {
        fn one(v: i64) -> String {
            if v < 0 {
                "-1".to_string()
            } else {
                format!("{v:x}")
            }
        }
        match self.pid {
            Some(p) => format!("p{}.{}", one(p), one(self.tid)),
            None => one(self.tid),
        }
    }
}

/// A stop reply (to `?`, `vCont`, `c`, `s`, or an interrupt).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReply {
    /// `Sxx` or `Txx n:r;...`: stopped with a signal (5 = SIGTRAP for
    /// breakpoints and steps, 2 = SIGINT after an interrupt).
    Signal {
        /// The signal number.
        signal: u8,
        /// The `thread:` pair, if sent.
        thread: Option<ThreadRef>,
        /// Every other `name:value` pair (e.g. `swbreak`, `watch`, registers).
        pairs: Vec<(String, String)>,
    },
    /// `Wxx[;process:pid]`: the process (for QEMU: the VM) exited.
    Exited {
        /// The exit code.
        code: u8,
    },
    /// `Xxx[;process:pid]`: the process (the VM) was terminated by a signal.
    Terminated {
        /// The signal.
        signal: u8,
    },
    /// `Oxx..`: console output from the target (hex-decoded).
    Output(Vec<u8>),
}

impl StopReply {
    /// Parses a stop reply packet; `None` when the packet is not one
    /// (`OK`, `E01`, register data...).
    pub fn parse(p: &[u8]) -> Option<Result<StopReply, ParseError>> {
        let (&kind, rest) = p.split_first()?;
        let code = |r: &[u8]| -> Result<u8, ParseError> {
            let digits = r
                .get(..2)
                .ok_or_else(|| ParseError::new("stop reply code", p))?;
            Ok(decode_hex(digits)?.first().copied().unwrap_or(0))
        };
        Some(match kind {
            b'S' if rest.len() == 2 => code(rest).map(|signal| StopReply::Signal {
                signal,
                thread: None,
                pairs: Vec::new(),
            }),
            b'T' if rest.len() >= 2 => (|| {
                let signal = code(rest)?;
                let mut thread = None;
                let mut pairs = Vec::new();
                for item in rest.get(2..).unwrap_or_default().split(|&b| b == b';') {
                    if item.is_empty() {
                        continue;
                    }
                    let mut kv = item.splitn(2, |&b| b == b':');
                    let k = kv.next().unwrap_or_default();
                    let v = kv.next().unwrap_or_default();
                    if k == b"thread" {
                        thread = Some(ThreadRef::parse(v)?);
                    } else {
                        pairs.push((
                            String::from_utf8_lossy(k).into_owned(),
                            String::from_utf8_lossy(v).into_owned(),
                        ));
                    }
                }
                Ok(StopReply::Signal {
                    signal,
                    thread,
                    pairs,
                })
            })(),
            b'W' if rest.len() >= 2 => code(rest).map(|code| StopReply::Exited { code }),
            b'X' if rest.len() >= 2 => code(rest).map(|signal| StopReply::Terminated { signal }),
            b'O' if !rest.is_empty() && rest != b"K" => decode_hex(rest).map(StopReply::Output),
            _ => return None,
        })
    }
}

/// Features a stub announced in its `qSupported` reply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// `PacketSize=`: the largest packet the stub accepts (bytes).
    pub packet_size: Option<usize>,
    /// Every `name+` feature.
    pub supported: Vec<String>,
    /// Every `name-` feature.
    pub unsupported: Vec<String>,
    /// Every `name=value` feature but PacketSize.
    pub values: Vec<(String, String)>,
}

impl Features {
    /// Parses a `qSupported` reply: `PacketSize=1000;qXfer:features:read+;...`.
    pub fn parse(reply: &[u8]) -> Features {
        let mut f = Features::default();
        for item in reply.split(|&b| b == b';') {
            let item = String::from_utf8_lossy(item);
            if let Some((k, v)) = item.split_once('=') {
                if k == "PacketSize" {
                    f.packet_size = parse_hex_u64(v.as_bytes())
                        .ok()
                        .and_then(|v| usize::try_from(v).ok());
                } else {
                    f.values.push((k.to_string(), v.to_string()));
                }
            } else if let Some(name) = item.strip_suffix('+') {
                f.supported.push(name.to_string());
            } else if let Some(name) = item.strip_suffix('-') {
                f.unsupported.push(name.to_string());
            } else if !item.is_empty() {
                f.supported.push(item.to_string());
            }
        }
        f
    }

    /// Whether `name+` was announced.
    pub fn has(&self, name: &str) -> bool {
        self.supported.iter().any(|s| s == name)
    }
}

/// Parses one `qfThreadInfo`/`qsThreadInfo` reply: `m p1.1,p1.2` gives the
/// threads and `false` (more may follow), `l` gives none and `true` (done).
pub fn parse_thread_list(reply: &[u8]) -> Result<(Vec<ThreadRef>, bool), ParseError> {
    match reply.split_first() {
        Some((b'l', [])) => Ok((Vec::new(), true)),
        Some((b'l', rest)) | Some((b'm', rest)) => {
            let done = reply.first() == Some(&b'l');
            let threads = rest
                .split(|&b| b == b',')
                .filter(|t| !t.is_empty())
                .map(ThreadRef::parse)
                .collect::<Result<Vec<_>, _>>()?;
            Ok((threads, done))
        }
        _ => Err(ParseError::new("thread list", reply)),
    }
}
