//! A bounded fuzz pass for the test suite, on stable Rust (dev-only).
//!
//! [`Fuzz`] runs a seeded mutation loop over seed inputs and calls a parser
//! on every mutant under [`std::panic::catch_unwind`]. A panic fails the
//! test with everything needed to reproduce it: the seed, the iteration,
//! the panic message and the input (in hex, and saved as a file under
//! `target/<profile>/fuzzcheck/`). Without coverage feedback it is no
//! match for cargo-fuzz (see `docs/FUZZING.md` for the longer runs); its
//! job is a few seconds per parser in every `cargo test`.
//!
//! ```no_run
//! hotprobe_fuzzcheck::Fuzz::new("maps")
//!     .seed(std::fs::read("/proc/self/maps").unwrap())
//!     .tokens(["-", " ", "\n", "r-xp", "[heap]"])
//!     .run(|data| !String::from_utf8_lossy(data).is_empty());
//! ```
//!
//! Environment:
//! - `HOTPROBE_FUZZ_SEED`: the seed (decimal or `0x` hex); default a fixed
//!   value derived from the target's name, so runs are deterministic.
//! - `HOTPROBE_FUZZ_SECS`: wall-clock cap per target (default 3).
//! - `HOTPROBE_FUZZ_ITERS`: iterations per target (default: the test's).
//! - `HOTPROBE_FUZZ_INPUT`: a file; the target runs on it alone, without
//!   catching the panic (to reproduce a saved failure under a debugger).
//! - `HOTPROBE_FUZZ_SEEDS_OUT`: a folder; the seeds are written to
//!   `FOLDER/NAME/seed-N` instead of fuzzing (the starting corpus of the
//!   cargo-fuzz target NAME, which takes the same input encoding).

use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, Instant};

/// Default wall-clock cap per target.
pub const DEFAULT_SECS: f64 = 3.0;
/// Default iteration count per target.
pub const DEFAULT_ITERATIONS: u64 = 20_000;
/// At most this many bytes of inputs are kept in the mutation pool.
const POOL_BYTES: usize = 64 << 20;
/// At most this many inputs in the pool (seeds included).
const POOL_INPUTS: usize = 512;

/// splitmix64: small, fast, deterministic.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator starting at `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 if `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, s: &'a [T]) -> &'a T {
        &s[self.below(s.len())]
    }
}

/// What a run did (also printed to stderr).
#[derive(Clone, Debug)]
pub struct Report {
    /// The seed used.
    pub seed: u64,
    /// Inputs tried (seeds included).
    pub inputs: u64,
    /// Inputs the target accepted (returned `true` for).
    pub accepted: u64,
    /// Wall-clock time spent.
    pub elapsed: Duration,
    /// The slowest single call.
    pub slowest: Duration,
}

/// A fuzz pass over one parser: seeds, a dictionary, limits.
#[derive(Clone, Debug)]
pub struct Fuzz {
    name: String,
    seeds: Vec<Vec<u8>>,
    tokens: Vec<Vec<u8>>,
    iterations: u64,
    secs: f64,
    max_len: Option<usize>,
}

thread_local! {
    /// Set while this thread runs a target: the panic hook stays quiet and
    /// records the message instead.
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Installs (once) a panic hook that records panics of threads running a
/// target and hands every other panic to the previous hook.
fn install_hook() {
    HOOK.call_once(|| {
        let prev = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if CAPTURING.with(Cell::get) {
                let payload = info.payload();
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(non-string panic payload)".to_string());
                let loc = info
                    .location()
                    .map(|l| format!(" at {}:{}:{}", l.file(), l.line(), l.column()))
                    .unwrap_or_default();
                CAUGHT.with(|c| *c.borrow_mut() = Some(format!("{msg}{loc}")));
            } else {
                prev(info);
            }
        }));
    });
}

/// FNV-1a: the default seed of a target, from its name.
fn name_seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether this is a long run (`HOTPROBE_FUZZ_SECS` of 30 or more): tests
/// add seeds then that are too slow to parse for the default few seconds
/// (a test binary with its debug information, say).
pub fn long_run() -> bool {
    std::env::var("HOTPROBE_FUZZ_SECS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .is_some_and(|s| s >= 30.0)
}

fn env_u64(var: &str) -> Option<u64> {
    let v = std::env::var(var).ok()?;
    let v = v.trim().replace('_', "");
    let parsed = match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => v.parse(),
    };
    match parsed {
        Ok(n) => Some(n),
        Err(_) => panic!("{var}={v:?} is not a number"),
    }
}

/// Where failing inputs go: `target/<profile>/fuzzcheck`, found from the
/// test executable (`target/<profile>/deps/NAME-HASH`).
fn failure_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    if dir.as_os_str().is_empty() {
        dir = std::env::temp_dir();
    }
    dir.join("fuzzcheck")
}

fn hex(data: &[u8], max: usize) -> String {
    let mut s: String = data.iter().take(max).map(|b| format!("{b:02x}")).collect();
    if data.len() > max {
        s.push_str(&format!("… ({} more bytes)", data.len() - max));
    }
    s
}

const BYTES: &[u8] = &[
    0x00, 0x01, 0x02, 0x7f, 0x80, 0x81, 0xfe, 0xff, b' ', b'\t', b'\n', b'\r', b'-', b'+', b':',
    b'0', b'1', b'9', b'a', b'f', b'x', b'%', b'[', b']', b'*', b'?', b'\\', b'/', b'.', b'#',
    b'$', b'}', b'{', 0xc3, 0xe2, 0xf0,
];

const WORDS: &[u64] = &[
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x1000,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    0xffff_ffff_ffff_fff0,
    0xffff_ffff_ffff_ffff,
];

const NUMBERS: &[&str] = &[
    "0",
    "-1",
    "-0",
    "+1",
    "0x",
    "0x0",
    "127",
    "128",
    "255",
    "256",
    "65535",
    "65536",
    "2147483647",
    "2147483648",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "ffffffffffffffff",
    "10000000000000000",
    "0xffffffffffffffff",
    "99999999999999999999999999",
];

struct Mutator<'a> {
    rng: Rng,
    tokens: &'a [Vec<u8>],
    max_len: usize,
}

impl Mutator<'_> {
    /// A position in `0..len` biased to the start and the end (headers and
    /// ELF section header tables).
    fn pos(&mut self, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        match self.rng.below(8) {
            0..=4 => self.rng.below(len),
            5 | 6 => self.rng.below(len.min(512)),
            _ => len - 1 - self.rng.below(len.min(4096)),
        }
    }

    /// A length for a chunk: mostly short, sometimes long.
    fn chunk_len(&mut self, max: usize) -> usize {
        if max == 0 {
            return 0;
        }
        let cap = if self.rng.one_in(4) { max } else { max.min(16) };
        1 + self.rng.below(cap)
    }

    fn insert(d: &mut Vec<u8>, at: usize, bytes: &[u8]) {
        let at = at.min(d.len());
        d.splice(at..at, bytes.iter().copied());
    }

    fn overwrite(d: &mut [u8], at: usize, bytes: &[u8]) {
        for (i, b) in bytes.iter().enumerate() {
            match d.get_mut(at + i) {
                Some(x) => *x = *b,
                None => break,
            }
        }
    }

    fn word_bytes(&mut self, v: u64) -> Vec<u8> {
        let width = *self.rng.pick(&[1usize, 2, 4, 4, 8, 8]);
        if self.rng.one_in(5) {
            v.to_be_bytes()[8 - width..].to_vec()
        } else {
            v.to_le_bytes()[..width].to_vec()
        }
    }

    fn line_starts(d: &[u8]) -> Vec<usize> {
        let mut v = vec![0];
        v.extend(
            d.iter()
                .enumerate()
                .filter(|(_, &b)| b == b'\n')
                .map(|(i, _)| i + 1),
        );
        v
    }

    /// One mutation of `d`; `pool` supplies material for splices.
    fn once(&mut self, d: &mut Vec<u8>, pool: &[Vec<u8>]) {
        let len = d.len();
        match self.rng.below(20) {
            // Bit flip.
            0 | 1 if len > 0 => {
                let i = self.pos(len);
                d[i] ^= 1 << self.rng.below(8);
            }
            // Random byte.
            2 if len > 0 => {
                let i = self.pos(len);
                d[i] = self.rng.next_u64() as u8;
            }
            // Interesting byte.
            3 if len > 0 => {
                let i = self.pos(len);
                d[i] = *self.rng.pick(BYTES);
            }
            // Interesting word, overwritten.
            4 if len > 0 => {
                let i = self.pos(len);
                let mut v = *self.rng.pick(WORDS);
                if self.rng.one_in(3) {
                    v = v.wrapping_neg();
                }
                let w = self.word_bytes(v);
                Self::overwrite(d, i, &w);
            }
            // Arithmetic on a byte or a little-endian u32.
            5 if len > 0 => {
                let i = self.pos(len);
                let delta = 1 + self.rng.below(35) as u32;
                let neg = self.rng.one_in(2);
                if len - i >= 4 && self.rng.one_in(2) {
                    let mut w = [0u8; 4];
                    w.copy_from_slice(&d[i..i + 4]);
                    let v = u32::from_le_bytes(w);
                    let v = if neg {
                        v.wrapping_sub(delta)
                    } else {
                        v.wrapping_add(delta)
                    };
                    d[i..i + 4].copy_from_slice(&v.to_le_bytes());
                } else {
                    d[i] = if neg {
                        d[i].wrapping_sub(delta as u8)
                    } else {
                        d[i].wrapping_add(delta as u8)
                    };
                }
            }
            // Delete a chunk.
            6 | 7 if len > 0 => {
                let i = self.pos(len);
                let n = self.chunk_len(len - i);
                d.drain(i..i + n);
            }
            // Insert random bytes, or a run of one byte.
            8 => {
                let i = self.pos(len + 1);
                let n = self.chunk_len(64);
                let bytes: Vec<u8> = if self.rng.one_in(2) {
                    let b = *self.rng.pick(BYTES);
                    let n = if self.rng.one_in(8) {
                        self.rng.below(2048)
                    } else {
                        n
                    };
                    vec![b; n]
                } else {
                    (0..n).map(|_| self.rng.next_u64() as u8).collect()
                };
                Self::insert(d, i, &bytes);
            }
            // Duplicate a chunk somewhere else.
            9 if len > 0 => {
                let i = self.pos(len);
                let n = self.chunk_len(len - i);
                let chunk = d[i..i + n].to_vec();
                let at = self.pos(len + 1);
                let reps = if self.rng.one_in(8) {
                    1 + self.rng.below(64)
                } else {
                    1
                };
                for _ in 0..reps {
                    Self::insert(d, at, &chunk);
                }
            }
            // Copy a chunk over another place.
            10 if len > 0 => {
                let i = self.pos(len);
                let n = self.chunk_len(len - i);
                let chunk = d[i..i + n].to_vec();
                let at = self.pos(len);
                Self::overwrite(d, at, &chunk);
            }
            // Splice: this input's head, another's tail.
            11 => {
                let other = self.rng.pick(pool);
                let i = self.pos(len + 1);
                let j = self.pos(other.len() + 1).min(other.len());
                d.truncate(i);
                d.extend_from_slice(&other[j..]);
            }
            // Insert a chunk of another input.
            12 => {
                let other = self.rng.pick(pool);
                if !other.is_empty() {
                    let j = self.pos(other.len());
                    let n = self.chunk_len(other.len() - j);
                    let at = self.pos(len + 1);
                    Self::insert(d, at, &other[j..j + n]);
                }
            }
            // Truncate.
            13 if len > 0 => {
                let i = self.pos(len);
                d.truncate(i);
            }
            // A dictionary token, inserted or overwritten.
            14 | 15 if !self.tokens.is_empty() => {
                let t = self.rng.pick(self.tokens).clone();
                if self.rng.one_in(2) {
                    let at = self.pos(len + 1);
                    Self::insert(d, at, &t);
                } else {
                    let at = self.pos(len);
                    Self::overwrite(d, at, &t);
                }
            }
            // A number as text.
            16 => {
                let n = self.rng.pick(NUMBERS).as_bytes();
                let at = self.pos(len + 1);
                Self::insert(d, at, n);
            }
            // Line edits: delete, duplicate, move.
            17 | 18 if d.contains(&b'\n') => {
                let starts = Self::line_starts(d);
                let k = self.rng.below(starts.len());
                let a = starts[k];
                let b = starts.get(k + 1).copied().unwrap_or(d.len());
                let line = d[a..b].to_vec();
                match self.rng.below(3) {
                    0 => {
                        d.drain(a..b);
                    }
                    1 => {
                        let reps = if self.rng.one_in(8) {
                            1 + self.rng.below(100)
                        } else {
                            1
                        };
                        for _ in 0..reps {
                            Self::insert(d, a, &line);
                        }
                    }
                    _ => {
                        d.drain(a..b);
                        let starts = Self::line_starts(d);
                        let at = *self.rng.pick(&starts);
                        Self::insert(d, at, &line);
                    }
                }
            }
            // Fill a chunk with one byte.
            _ if len > 0 => {
                let i = self.pos(len);
                let n = self.chunk_len(len - i);
                let b = *self.rng.pick(BYTES);
                d[i..i + n].fill(b);
            }
            _ => {
                let b = *self.rng.pick(BYTES);
                d.push(b);
            }
        }
    }

    /// A mutant of `parent`: one to eight stacked mutations.
    fn mutate(&mut self, parent: &[u8], pool: &[Vec<u8>]) -> Vec<u8> {
        let mut d = parent.to_vec();
        let n = 1 + (self.rng.next_u64().trailing_zeros() as usize).min(7);
        for _ in 0..n {
            self.once(&mut d, pool);
        }
        d.truncate(self.max_len);
        d
    }
}

impl Fuzz {
    /// A pass named `name` (used for the default seed, messages and the
    /// saved input's file name).
    pub fn new(name: &str) -> Fuzz {
        Fuzz {
            name: name.to_string(),
            seeds: Vec::new(),
            tokens: Vec::new(),
            iterations: DEFAULT_ITERATIONS,
            secs: DEFAULT_SECS,
            max_len: None,
        }
    }

    /// Adds a seed input.
    pub fn seed(mut self, bytes: impl Into<Vec<u8>>) -> Fuzz {
        self.seeds.push(bytes.into());
        self
    }

    /// Adds seed inputs.
    pub fn seeds<T: Into<Vec<u8>>>(mut self, seeds: impl IntoIterator<Item = T>) -> Fuzz {
        self.seeds.extend(seeds.into_iter().map(Into::into));
        self
    }

    /// Adds the file at `path` as a seed if it can be read (a note on
    /// stderr otherwise: seeds from the system are best effort).
    pub fn seed_file(mut self, path: impl AsRef<Path>) -> Fuzz {
        let path = path.as_ref();
        match std::fs::read(path) {
            Ok(b) => self.seeds.push(b),
            Err(e) => eprintln!(
                "fuzzcheck {}: seed {} skipped: {e}",
                self.name,
                path.display()
            ),
        }
        self
    }

    /// Adds dictionary tokens (keywords, separators of the format).
    pub fn tokens<T: AsRef<[u8]>>(mut self, tokens: impl IntoIterator<Item = T>) -> Fuzz {
        self.tokens
            .extend(tokens.into_iter().map(|t| t.as_ref().to_vec()));
        self
    }

    /// Iterations (unless `HOTPROBE_FUZZ_ITERS` says otherwise).
    pub fn iterations(mut self, n: u64) -> Fuzz {
        self.iterations = n;
        self
    }

    /// Wall-clock cap in seconds (unless `HOTPROBE_FUZZ_SECS` says
    /// otherwise).
    pub fn secs(mut self, secs: f64) -> Fuzz {
        self.secs = secs;
        self
    }

    /// Longest mutant (default: the longest seed plus 4 KiB).
    pub fn max_len(mut self, n: usize) -> Fuzz {
        self.max_len = Some(n);
        self
    }

    /// Runs `target` on the seeds and then on mutants until the iteration
    /// count or the time cap is reached. `target` returns whether it
    /// accepted the input (parsed it): accepted mutants are kept and
    /// mutated further. Panics (failing the test) if `target` panics, with
    /// the reproduction details.
    pub fn run(self, target: impl Fn(&[u8]) -> bool) -> Report {
        assert!(!self.seeds.is_empty(), "fuzzcheck {}: no seeds", self.name);
        if let Ok(path) = std::env::var("HOTPROBE_FUZZ_INPUT") {
            let data =
                std::fs::read(&path).unwrap_or_else(|e| panic!("HOTPROBE_FUZZ_INPUT={path}: {e}"));
            eprintln!(
                "fuzzcheck {}: replaying {path} ({} bytes)",
                self.name,
                data.len()
            );
            let t0 = Instant::now();
            let accepted = target(&data);
            return Report {
                seed: 0,
                inputs: 1,
                accepted: u64::from(accepted),
                elapsed: t0.elapsed(),
                slowest: t0.elapsed(),
            };
        }
        if let Ok(dir) = std::env::var("HOTPROBE_FUZZ_SEEDS_OUT") {
            return self.export_seeds(Path::new(&dir));
        }
        install_hook();
        let seed = env_u64("HOTPROBE_FUZZ_SEED").unwrap_or_else(|| name_seed(&self.name));
        let iterations = env_u64("HOTPROBE_FUZZ_ITERS").unwrap_or(self.iterations);
        let secs = match std::env::var("HOTPROBE_FUZZ_SECS") {
            Ok(s) => s
                .trim()
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("HOTPROBE_FUZZ_SECS={s:?} is not a number")),
            Err(_) => self.secs,
        };
        let cap = Duration::from_secs_f64(secs.max(0.0));
        eprintln!(
            "fuzzcheck {}: seed {seed:#x} (HOTPROBE_FUZZ_SEED), up to {iterations} inputs or {secs} s",
            self.name
        );
        let longest = self.seeds.iter().map(Vec::len).max().unwrap_or(0);
        let mut m = Mutator {
            rng: Rng::new(seed),
            tokens: &self.tokens,
            max_len: self.max_len.unwrap_or(longest + 4096),
        };
        let n_seeds = self.seeds.len();
        let mut pool: Vec<Vec<u8>> = self.seeds.clone();
        let mut pool_bytes: usize = pool.iter().map(Vec::len).sum();
        let t0 = Instant::now();
        let mut report = Report {
            seed,
            inputs: 0,
            accepted: 0,
            elapsed: Duration::ZERO,
            slowest: Duration::ZERO,
        };
        let mut i: u64 = 0;
        loop {
            // The seeds and the empty input first, then mutants.
            let input = if (i as usize) < n_seeds {
                pool[i as usize].clone()
            } else if i as usize == n_seeds {
                Vec::new()
            } else {
                if i >= iterations || t0.elapsed() >= cap {
                    break;
                }
                let parent = m.rng.below(pool.len());
                m.mutate(&pool[parent], &pool)
            };
            let t = Instant::now();
            CAPTURING.with(|c| c.set(true));
            let result = panic::catch_unwind(AssertUnwindSafe(|| target(&input)));
            CAPTURING.with(|c| c.set(false));
            report.slowest = report.slowest.max(t.elapsed());
            report.inputs += 1;
            match result {
                Ok(true) => {
                    report.accepted += 1;
                    if i as usize > n_seeds && !pool.contains(&input) {
                        let fits =
                            pool.len() < POOL_INPUTS && pool_bytes + input.len() <= POOL_BYTES;
                        if fits {
                            pool_bytes += input.len();
                            pool.push(input);
                        } else if pool.len() > n_seeds {
                            let k = n_seeds + m.rng.below(pool.len() - n_seeds);
                            if pool_bytes - pool[k].len() + input.len() <= POOL_BYTES {
                                pool_bytes = pool_bytes - pool[k].len() + input.len();
                                pool[k] = input;
                            }
                        }
                    }
                }
                Ok(false) => {}
                Err(_) => {
                    let msg = CAUGHT
                        .with(|c| c.borrow_mut().take())
                        .unwrap_or_else(|| "(panic message not captured)".to_string());
                    self.fail(seed, i, &input, &msg);
                }
            }
            i += 1;
        }
        report.elapsed = t0.elapsed();
        eprintln!(
            "fuzzcheck {}: {} inputs in {:.2?} ({} accepted, pool {}), slowest {:.2?}",
            self.name,
            report.inputs,
            report.elapsed,
            report.accepted,
            pool.len(),
            report.slowest
        );
        report
    }

    /// Writes the seeds to `dir/NAME/seed-N` (a corpus for the cargo-fuzz
    /// target of the same name) instead of fuzzing.
    fn export_seeds(&self, dir: &Path) -> Report {
        let d = dir.join(&self.name);
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for (i, s) in self.seeds.iter().enumerate() {
            let p = d.join(format!("seed-{i}"));
            std::fs::write(&p, s).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        }
        eprintln!(
            "fuzzcheck {}: {} seeds written to {}",
            self.name,
            self.seeds.len(),
            d.display()
        );
        Report {
            seed: 0,
            inputs: 0,
            accepted: 0,
            elapsed: Duration::ZERO,
            slowest: Duration::ZERO,
        }
    }

    fn fail(&self, seed: u64, iteration: u64, input: &[u8], msg: &str) -> ! {
        let safe: String = self
            .name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let dir = failure_dir();
        let path = dir.join(format!("{safe}-{seed:016x}-{iteration}.bin"));
        let saved = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&path, input))
            .map(|()| path.display().to_string())
            .unwrap_or_else(|e| format!("(not saved: {e})"));
        panic!(
            "fuzzcheck {name}: the target panicked on input {iteration} \
             (HOTPROBE_FUZZ_SEED={seed:#x}): {msg}\n\
             input ({len} bytes) saved to {saved}\n\
             reproduce: HOTPROBE_FUZZ_INPUT={saved} cargo test <this test>\n\
             input as hex: {hex}",
            name = self.name,
            len = input.len(),
            hex = hex(input, 2048),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_mutants() {
        let pool = vec![b"hello world\nline two\n".to_vec(), vec![1, 2, 3, 4, 5]];
        let run = |seed| {
            let mut m = Mutator {
                rng: Rng::new(seed),
                tokens: &[],
                max_len: 100,
            };
            (0..200)
                .map(|k| m.mutate(&pool[k % 2], &pool))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        assert!(run(7).iter().all(|d| d.len() <= 100));
    }

    #[test]
    fn a_panic_is_found_and_saved() {
        let r = panic::catch_unwind(|| {
            Fuzz::new("self-test")
                .seed(b"abc".to_vec())
                .tokens(["boom"])
                .iterations(100_000)
                .run(|d| {
                    assert!(!d.windows(4).any(|w| w == b"boom"), "found the token");
                    true
                })
        });
        let err = r.expect_err("the token is found");
        let msg = err.downcast_ref::<String>().expect("formatted message");
        assert!(msg.contains("found the token"), "{msg}");
        assert!(msg.contains("HOTPROBE_FUZZ_SEED="), "{msg}");
        let saved = msg
            .lines()
            .find_map(|l| l.strip_prefix("input ("))
            .and_then(|l| l.split(" saved to ").nth(1))
            .expect("saved path");
        let data = std::fs::read(saved).expect("saved input");
        assert!(data.windows(4).any(|w| w == b"boom"));
        let _ = std::fs::remove_file(saved);
    }

    #[test]
    fn clean_target_passes() {
        let r = Fuzz::new("clean")
            .seed(vec![0u8; 64])
            .iterations(500)
            .run(|d| d.len() % 2 == 0);
        assert_eq!(r.inputs, 500, "seeds and the empty input count");
    }
}
