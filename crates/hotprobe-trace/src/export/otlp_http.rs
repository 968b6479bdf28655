//! The OTLP/HTTP transport: POSTs the bodies [`export_otlp`] encodes to a
//! receiver (an OpenTelemetry Collector, or any OTLP/HTTP endpoint) with
//! `ureq`, a blocking HTTP/1.1 client with no async runtime. Plain
//! `http://` only (a local or in-cluster collector; no TLS is linked), no
//! proxy from the environment (the receiver is reached directly), no
//! redirects followed. One connection is kept alive across the requests
//! of an export.
//!
//! [`export_otlp`]: super::export_otlp

use std::io::Read;
use std::time::Duration;

use super::otlp::OtlpSignal;

/// The OTLP/HTTP default port.
pub const OTLP_HTTP_PORT: u16 = 4318;

/// Why an endpoint URL was refused by [`OtlpEndpoint::parse`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OtlpEndpointError {
    /// Not a URL with a scheme, or a scheme other than http/https.
    #[error("give an http://HOST:PORT URL")]
    NotHttp,
    /// An `https://` URL: no TLS client is linked.
    #[error("https is not supported; give an http:// URL (a local collector)")]
    Https,
    /// The port is not a number in 0..=65535.
    #[error("`{0}` is not a port")]
    BadPort(String),
    /// A `[` without its `]`, or something other than `:PORT` after it.
    #[error("bad IPv6 address")]
    BadIpv6,
    /// No host before the port or path.
    #[error("no host")]
    NoHost,
}

/// An OTLP/HTTP receiver: `http://HOST[:PORT][/PREFIX]` (port 4318 by
/// default); bodies are POSTed to `PREFIX/v1/traces` and
/// `PREFIX/v1/metrics` (a URL already ending in one of them is taken as
/// its prefix) with `Content-Type: application/x-protobuf`.
pub struct OtlpEndpoint {
    url: String,
    host: String,
    port: u16,
    prefix: String,
    agent: ureq::Agent,
}

impl std::fmt::Debug for OtlpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpEndpoint")
            .field("url", &self.url)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl OtlpEndpoint {
    /// Parses `http://HOST[:PORT][/PREFIX]` (HOST may be `[IPv6]`).
    pub fn parse(url: &str) -> Result<OtlpEndpoint, OtlpEndpointError> {
        let rest = match url.split_once("://") {
            Some(("http", r)) => r,
            Some(("https", _)) => return Err(OtlpEndpointError::Https),
            Some(_) | None => return Err(OtlpEndpointError::NotHttp),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let port_of = |p: &str| {
            p.parse::<u16>()
                .map_err(|_| OtlpEndpointError::BadPort(p.to_string()))
        };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            match v6.split_once(']') {
                Some((h, "")) => (h, OTLP_HTTP_PORT),
                Some((h, p)) => match p.strip_prefix(':') {
                    Some(p) => (h, port_of(p)?),
                    None => return Err(OtlpEndpointError::BadIpv6),
                },
                None => return Err(OtlpEndpointError::BadIpv6),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, port_of(p)?),
                None => (authority, OTLP_HTTP_PORT),
            }
        };
        if host.is_empty() {
            return Err(OtlpEndpointError::NoHost);
        }
        let mut prefix = path.trim_end_matches('/').to_string();
        for s in [OtlpSignal::Traces.path(), OtlpSignal::Metrics.path()] {
            if let Some(p) = prefix.strip_suffix(s) {
                prefix = p.to_string();
            }
        }
        let agent = ureq::Agent::config_builder()
            .proxy(None)
            .max_redirects(0)
            .max_redirects_will_error(false)
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_per_read(Some(Duration::from_secs(30)))
            .timeout_per_write(Some(Duration::from_secs(30)))
            .user_agent(concat!("hotprobe/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Ok(OtlpEndpoint {
            url: url.to_string(),
            host: host.into(),
            port,
            prefix,
            agent,
        })
    }

    /// The URL as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The host (an IPv6 address without its brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port (4318 when the URL names none).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The path before `/v1/traces` and `/v1/metrics` (empty, or starting
    /// with `/` and not ending with one).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `HOST:PORT` as in a URL (`[::1]:4318` for IPv6).
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// POSTs one OTLP protobuf body of `signal`. A transport error, or a
    /// status other than 2xx (with the start of the response body), is an
    /// error naming the path and the receiver.
    pub fn post(&self, signal: OtlpSignal, body: &[u8]) -> std::io::Result<()> {
        let path = format!("{}{}", self.prefix, signal.path());
        let host = self.authority();
        let what = || format!("POST {path} to {host}");
        let mut resp = self
            .agent
            .post(format!("http://{host}{path}"))
            .header("Content-Type", "application/x-protobuf")
            .send(body)
            .map_err(|e| match e {
                ureq::Error::Io(e) => std::io::Error::new(e.kind(), format!("{}: {e}", what())),
                e => std::io::Error::other(format!("{}: {e}", what())),
            })?;
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(());
        }
        // The start of the answer: text, or a protobuf google.rpc.Status
        // whose message is shown with the other bytes left out.
        let mut start = Vec::new();
        let _ = resp
            .body_mut()
            .as_reader()
            .take(4096)
            .read_to_end(&mut start);
        let text: String = String::from_utf8_lossy(&start)
            .chars()
            .filter(|c| !c.is_control() && *c != char::REPLACEMENT_CHARACTER)
            .take(200)
            .collect();
        Err(std::io::Error::other(format!(
            "{}: HTTP {status}: {}",
            what(),
            text.trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let e = OtlpEndpoint::parse("http://localhost:4318").unwrap();
        assert_eq!((e.host(), e.port(), e.prefix()), ("localhost", 4318, ""));
        let e = OtlpEndpoint::parse("http://127.0.0.1:9/otlp/v1/traces/").unwrap();
        assert_eq!((e.host(), e.port(), e.prefix()), ("127.0.0.1", 9, "/otlp"));
        let e = OtlpEndpoint::parse("http://[::1]:5000").unwrap();
        assert_eq!((e.host(), e.port()), ("::1", 5000));
        assert_eq!(e.authority(), "[::1]:5000");
        assert_eq!(
            OtlpEndpoint::parse("http://collector").unwrap().port(),
            4318
        );
        assert_eq!(
            OtlpEndpoint::parse("https://x:1").unwrap_err(),
            OtlpEndpointError::Https
        );
        assert_eq!(
            OtlpEndpoint::parse("localhost:4318").unwrap_err(),
            OtlpEndpointError::NotHttp
        );
        assert_eq!(
            OtlpEndpoint::parse("http://x:port").unwrap_err(),
            OtlpEndpointError::BadPort("port".into())
        );
        assert_eq!(
            OtlpEndpoint::parse("http://[::1/x").unwrap_err(),
            OtlpEndpointError::BadIpv6
        );
        assert_eq!(
            OtlpEndpoint::parse("http://:80").unwrap_err(),
            OtlpEndpointError::NoHost
        );
    }

    /// One request to a listener of this test: the path, headers and body
    /// the client sent, and a 400 answer turned into an error with its text.
    #[test]
    fn posts_protobuf_and_reports_refusals() {
        use std::io::{BufRead, BufReader, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let mut got = Vec::new();
            for status in ["200 OK", "400 Bad Request"] {
                let (s, _) = l.accept().unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut head = Vec::new();
                loop {
                    let mut line = String::new();
                    r.read_line(&mut line).unwrap();
                    if line == "\r\n" || line.is_empty() {
                        break;
                    }
                    head.push(line.trim_end().to_string());
                }
                let len: usize = head
                    .iter()
                    .find_map(|h| {
                        h.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap();
                let mut body = vec![0; len];
                r.read_exact(&mut body).unwrap();
                let answer = if status.starts_with("200") {
                    ""
                } else {
                    "no such signal"
                };
                write!(
                    &s,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                    answer.len()
                )
                .unwrap();
                got.push((head, body));
            }
            got
        });
        let e = OtlpEndpoint::parse(&format!("http://127.0.0.1:{port}/p")).unwrap();
        e.post(OtlpSignal::Traces, b"\x0a\x00").unwrap();
        let err = e.post(OtlpSignal::Metrics, b"xyz").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("POST /p/v1/metrics to 127.0.0.1:{port}: HTTP 400: no such signal")
        );
        let got = server.join().unwrap();
        assert_eq!(got[0].0[0], "POST /p/v1/traces HTTP/1.1");
        assert!(got[0]
            .0
            .iter()
            .any(|h| h.eq_ignore_ascii_case("content-type: application/x-protobuf")));
        assert_eq!(got[0].1, b"\x0a\x00");
        assert_eq!(got[1].0[0], "POST /p/v1/metrics HTTP/1.1");
        assert_eq!(got[1].1, b"xyz");
    }
}
