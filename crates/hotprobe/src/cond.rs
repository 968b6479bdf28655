//! Argument conditions of counting probes: `'PROBE if CONDITION'` on the
//! command line, `hotprobe_count_if` in C, `Session.count(..., cond=...)`
//! in Python; evaluated on recorded entry events by
//! [`crate::CountSink`].
//!
//! ```text
//! condition  := or
//! or         := and ( "||" and )*
//! and        := unary ( "&&" unary )*
//! unary      := "!" unary | "(" or ")" | comparison
//! comparison := operand ( "==" | "!=" | "<" | "<=" | ">" | ">=" ) operand
//! operand    := "arg0" … "arg5" | NAME | integer  (decimal or 0x hex, optional "-")
//! ```
//!
//! Conditions nest at most [`MAX_DEPTH`] levels (parentheses and `!`) and
//! hold at most [`MAX_TERMS`] comparisons: deeper or longer ones are a
//! [`CondError::TooDeep`] / [`CondError::TooLong`], never a stack overflow.
//!
//! A NAME is a parameter of the probed function, found in its DWARF
//! (`count 'greet if n > 2'`): one the SysV ABI passes in an integer
//! register at the entry, compared with its own size and signedness
//! ([`Cond::parse_with`] with the caller's map from names to registers;
//! [`Cond::parse`] knows `arg0`…`arg5` only). [`named_cond`] compiles a
//! condition for the function a probe was placed on, from the parameters
//! [`crate::typed::Typing::name_chooser`] noted while it was placed; the
//! command line, the C API's `hotprobe_count_if` and Python's
//! `Session.count(..., cond=...)` all go through it
//! ([`crate::CountSink::place`]).
//!
//! Arguments are the entry's argument registers (rdi, rsi, rdx, rcx, r8,
//! r9) compared as signed 64-bit integers: `arg0 < 0` holds for -1. A
//! comparison naming an argument the event did not record is false.

/// How deep parentheses and `!` nest in a condition.
pub const MAX_DEPTH: usize = 64;

/// Comparisons in one condition.
pub const MAX_TERMS: usize = 256;

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// A comparison operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    /// Argument register N (0–5).
    Arg(u8),
    /// A named parameter: argument register `reg`, its low `size` bytes,
    /// signed or not (compared exactly, e.g. an `unsigned long` above
    /// 2^63 is greater than any constant).
    Param {
        /// Register (0–5).
        reg: u8,
        /// Bytes (1, 2, 4, 8).
        size: u8,
        /// Signed.
        signed: bool,
    },
    /// A constant.
    Const(i64),
}

/// A parsed condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cond {
    /// `a OP b`.
    Cmp(Operand, Op, Operand),
    /// `a && b`.
    And(Box<Cond>, Box<Cond>),
    /// `a || b`.
    Or(Box<Cond>, Box<Cond>),
    /// `!a`.
    Not(Box<Cond>),
}

/// Why a condition does not parse; `pos` is the 1-based column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CondError {
    /// Something else was expected here.
    #[error("column {pos}: expected {expected}, found `{found}`")]
    Unexpected {
        /// Column.
        pos: usize,
        /// What was found.
        found: String,
        /// What would have been accepted.
        expected: &'static str,
    },
    /// The condition ended too early.
    #[error("column {pos}: expected {expected}, found the end of the condition")]
    End {
        /// Column.
        pos: usize,
        /// What would have been accepted.
        expected: &'static str,
    },
    /// A number out of range or malformed.
    #[error("column {pos}: `{text}` is not a 64-bit integer")]
    BadNumber {
        /// Column.
        pos: usize,
        /// The text.
        text: String,
    },
    /// `argN` with N > 5.
    #[error("column {pos}: arg{n} does not exist (arg0 to arg5: rdi, rsi, rdx, rcx, r8, r9)")]
    NoSuchArg {
        /// Column.
        pos: usize,
        /// N.
        n: u64,
    },
    /// A name that is not an argument.
    #[error("column {pos}: unknown name `{name}` (arg0 to arg5)")]
    UnknownName {
        /// Column.
        pos: usize,
        /// The name.
        name: String,
    },
    /// Parentheses and `!` nested deeper than [`MAX_DEPTH`].
    #[error("column {pos}: the condition nests deeper than {limit} levels (parentheses and `!`)")]
    TooDeep {
        /// Column.
        pos: usize,
        /// The limit.
        limit: usize,
    },
    /// More comparisons than [`MAX_TERMS`].
    #[error("column {pos}: the condition has more than {limit} comparisons")]
    TooLong {
        /// Column.
        pos: usize,
        /// The limit.
        limit: usize,
    },
    /// `argN` of a USDT marker that has fewer arguments (`arg1` is the
    /// first, as `trace` shows them).
    #[error("column {pos}: arg{n} is no argument of this USDT marker (it has arg1 to arg{count})")]
    NoSuchUsdtArg {
        /// Column.
        pos: usize,
        /// N.
        n: u64,
        /// The marker's arguments.
        count: usize,
    },
    /// A parameter name that cannot be compared (not in an integer
    /// register, or not a parameter of the function).
    #[error("column {pos}: `{name}`: {why}")]
    BadName {
        /// Column.
        pos: usize,
        /// The name.
        name: String,
        /// Why.
        why: String,
    },
}

/// Why a condition naming parameters does not compile for the function a
/// probe was placed on ([`named_cond`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamedCondError {
    /// The function has no DWARF: its parameters have no names here.
    #[error("the condition names a parameter, and {function} has no DWARF (build with -g)")]
    NoDwarf {
        /// The function (or the probe's label).
        function: String,
    },
    /// A name that is none of the function's parameters.
    #[error(
        "the condition: {function} has no parameter {name}; its parameters: {}",
        .params.join(", ")
    )]
    NoSuchParam {
        /// The function (or the probe's label).
        function: String,
        /// The name.
        name: String,
        /// The function's parameters, in order.
        params: Vec<String>,
    },
    /// Any other error of the condition (a parameter that is not in an
    /// integer register, a syntax error).
    #[error("the condition: {0}")]
    Cond(CondError),
}

/// Compiles the condition `text` for the function the probe `p` was
/// placed on: its names are that function's parameters, as `typing`
/// noted them when the probe was placed (with
/// [`crate::typed::Typing::name_chooser`] as the session's capture
/// chooser), besides `arg0`…`arg5`.
pub fn named_cond(
    typing: &crate::typed::Typing,
    p: &crate::Placement,
    text: &str,
) -> Result<Cond, NamedCondError> {
    let function = p.function.clone().unwrap_or_else(|| p.label.clone());
    let Some(regs) = typing.param_registers(p.addr.0) else {
        return Err(NamedCondError::NoDwarf { function });
    };
    let map = |name: &str| regs.iter().find(|(n, _)| n == name).map(|(_, r)| r.clone());
    Cond::parse_with(text, &map).map_err(|e| match e {
        CondError::UnknownName { name, .. } => NamedCondError::NoSuchParam {
            function,
            name,
            params: regs.iter().map(|(n, _)| n.clone()).collect(),
        },
        e => NamedCondError::Cond(e),
    })
}

/// A condition naming parameters, of a probe still pending (its module
/// not loaded yet: nothing names its parameters): compiled when the probe
/// is armed ([`crate::EventSink::pending_armed`]), from the DWARF of the
/// module's file ([`crate::CountSink::add_pending_named`]).
#[derive(Clone)]
pub struct DeferredCond {
    text: String,
    typing: std::rc::Rc<crate::typed::Typing>,
}

impl std::fmt::Debug for DeferredCond {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredCond")
            .field("text", &self.text)
            .finish_non_exhaustive()
    }
}

impl DeferredCond {
    /// The condition `text`, its names to be read through `typing`.
    pub fn new(text: &str, typing: std::rc::Rc<crate::typed::Typing>) -> DeferredCond {
        DeferredCond {
            text: text.to_string(),
            typing,
        }
    }

    /// The condition's text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Compiles it for the probe as `armed` placed it ([`named_cond`]).
    pub fn compile(&self, armed: &crate::ArmedPending) -> Result<Cond, NamedCondError> {
        self.typing.note_params_in(&armed.resolved, &armed.path);
        named_cond(&self.typing, &armed.placement, &self.text)
    }
}

/// How a condition's parameter names map to argument registers: `None`
/// for a name the function does not know, else its operand
/// ([`Operand::Param`]) or why it has none.
pub type NameMap<'a> = &'a dyn Fn(&str) -> Option<Result<Operand, String>>;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Name(String),
    Num(i64),
    Op(Op),
    And,
    Or,
    Not,
    LParen,
    RParen,
}

fn lex(s: &str) -> Result<Vec<(usize, Tok)>, CondError> {
    let b: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let pos = i + 1;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let two: String = b[i..(i + 2).min(b.len())].iter().collect();
        let (tok, n) = match (c, two.as_str()) {
            (_, "&&") => (Tok::And, 2),
            (_, "||") => (Tok::Or, 2),
            (_, "==") => (Tok::Op(Op::Eq), 2),
            (_, "!=") => (Tok::Op(Op::Ne), 2),
            (_, "<=") => (Tok::Op(Op::Le), 2),
            (_, ">=") => (Tok::Op(Op::Ge), 2),
            ('<', _) => (Tok::Op(Op::Lt), 1),
            ('>', _) => (Tok::Op(Op::Gt), 1),
            ('!', _) => (Tok::Not, 1),
            ('(', _) => (Tok::LParen, 1),
            (')', _) => (Tok::RParen, 1),
            _ if c.is_ascii_digit() || c == '-' => {
                let mut j = i + 1;
                while j < b.len() && b[j].is_ascii_alphanumeric() {
                    j += 1;
                }
                let text: String = b[i..j].iter().collect();
                let (neg, body) = match text.strip_prefix('-') {
                    Some(r) => (true, r),
                    None => (false, text.as_str()),
                };
                let mag = match body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
                    Some(h) => u64::from_str_radix(h, 16).ok(),
                    None => body.parse::<u64>().ok(),
                };
                let v = match (mag, neg) {
                    (Some(m), false) => Some(m as i64),
                    (Some(m), true) if m <= 1 << 63 => Some((m as i64).wrapping_neg()),
                    _ => None,
                };
                match v {
                    Some(v) => (Tok::Num(v), j - i),
                    None => return Err(CondError::BadNumber { pos, text }),
                }
            }
            _ if c.is_ascii_alphabetic() || c == '_' => {
                let mut j = i + 1;
                while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == '_') {
                    j += 1;
                }
                (Tok::Name(b[i..j].iter().collect()), j - i)
            }
            _ => {
                return Err(CondError::Unexpected {
                    pos,
                    found: c.to_string(),
                    expected: "an argument, a number, an operator or a parenthesis",
                })
            }
        };
        out.push((pos, tok));
        i += n;
    }
    Ok(out)
}

struct Parser<'a> {
    toks: Vec<(usize, Tok)>,
    at: usize,
    end: usize,
    names: Option<NameMap<'a>>,
    /// A USDT marker's arguments: `argN` is its Nth operand (1-based).
    usdt: Option<&'a [hotprobe_symbols::UsdtArg]>,
    /// Parentheses and `!` open now.
    depth: usize,
    /// Comparisons so far.
    terms: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at).map(|t| &t.1)
    }

    fn pos(&self) -> usize {
        self.toks.get(self.at).map_or(self.end, |t| t.0)
    }

    fn err(&self, expected: &'static str) -> CondError {
        match self.toks.get(self.at) {
            Some((pos, t)) => CondError::Unexpected {
                pos: *pos,
                found: show(t),
                expected,
            },
            None => CondError::End {
                pos: self.end,
                expected,
            },
        }
    }

    fn or(&mut self) -> Result<Cond, CondError> {
        let mut l = self.and()?;
        while self.peek() == Some(&Tok::Or) {
            self.at += 1;
            l = Cond::Or(Box::new(l), Box::new(self.and()?));
        }
        Ok(l)
    }

    fn and(&mut self) -> Result<Cond, CondError> {
        let mut l = self.unary()?;
        while self.peek() == Some(&Tok::And) {
            self.at += 1;
            l = Cond::And(Box::new(l), Box::new(self.unary()?));
        }
        Ok(l)
    }

    /// Enters one more level of parentheses or `!`.
    fn deeper(&mut self) -> Result<(), CondError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(CondError::TooDeep {
                pos: self.pos(),
                limit: MAX_DEPTH,
            });
        }
        self.at += 1;
        Ok(())
    }

    fn unary(&mut self) -> Result<Cond, CondError> {
        match self.peek() {
            Some(Tok::Not) => {
                self.deeper()?;
                let c = Cond::Not(Box::new(self.unary()?));
                self.depth -= 1;
                Ok(c)
            }
            Some(Tok::LParen) => {
                self.deeper()?;
                let c = self.or()?;
                if self.peek() != Some(&Tok::RParen) {
                    return Err(self.err("`)`"));
                }
                self.at += 1;
                self.depth -= 1;
                Ok(c)
            }
            _ => {
                self.terms += 1;
                if self.terms > MAX_TERMS {
                    return Err(CondError::TooLong {
                        pos: self.pos(),
                        limit: MAX_TERMS,
                    });
                }
                let a = self.operand()?;
                let op = match self.peek() {
                    Some(Tok::Op(op)) => *op,
                    _ => return Err(self.err("a comparison (== != < <= > >=)")),
                };
                self.at += 1;
                let b = self.operand()?;
                Ok(Cond::Cmp(a, op, b))
            }
        }
    }

    fn operand(&mut self) -> Result<Operand, CondError> {
        let pos = self.pos();
        let r = match self.peek() {
            Some(Tok::Num(v)) => Operand::Const(*v),
            Some(Tok::Name(n)) => {
                let idx = n
                    .strip_prefix("arg")
                    .filter(|d| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()));
                match idx.map(|d| d.parse::<u64>().unwrap_or(u64::MAX)) {
                    Some(k) if self.usdt.is_some() => {
                        let args = self.usdt.unwrap_or_default();
                        match args.get((k as usize).wrapping_sub(1)) {
                            // Not read at hits (the capture has no form for
                            // it): every hit would go uncounted.
                            Some(hotprobe_symbols::UsdtArg {
                                operand:
                                    hotprobe_symbols::UsdtOperand::Memory {
                                        index,
                                        rip_relative,
                                        ..
                                    },
                                ..
                            }) if index.is_some() || *rip_relative => {
                                return Err(CondError::BadName {
                                    pos,
                                    name: n.clone(),
                                    why: "an indexed or %rip-relative memory operand, which \
                                          hotprobe does not read yet (trace shows it as not read)"
                                        .into(),
                                })
                            }
                            Some(a) if (1..=255).contains(&k) => Operand::Param {
                                reg: (k - 1) as u8,
                                size: a.size.clamp(1, 8),
                                signed: a.signed,
                            },
                            _ => {
                                return Err(CondError::NoSuchUsdtArg {
                                    pos,
                                    n: k,
                                    count: args.len(),
                                })
                            }
                        }
                    }
                    Some(k) if k < 6 => Operand::Arg(k as u8),
                    Some(k) => return Err(CondError::NoSuchArg { pos, n: k }),
                    None => match self.names.map(|f| f(n)) {
                        Some(Some(Ok(o))) => o,
                        Some(Some(Err(why))) => {
                            return Err(CondError::BadName {
                                pos,
                                name: n.clone(),
                                why,
                            })
                        }
                        _ => {
                            return Err(CondError::UnknownName {
                                pos,
                                name: n.clone(),
                            })
                        }
                    },
                }
            }
            _ => return Err(self.err("an argument (arg0 to arg5) or a number")),
        };
        self.at += 1;
        Ok(r)
    }
}

fn show(t: &Tok) -> String {
    match t {
        Tok::Name(n) => n.clone(),
        Tok::Num(v) => v.to_string(),
        Tok::Op(op) => match op {
            Op::Eq => "==",
            Op::Ne => "!=",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
        .into(),
        Tok::And => "&&".into(),
        Tok::Or => "||".into(),
        Tok::Not => "!".into(),
        Tok::LParen => "(".into(),
        Tok::RParen => ")".into(),
    }
}

impl Cond {
    /// Parses a condition.
    pub fn parse(s: &str) -> Result<Cond, CondError> {
        Cond::parse_names(s, None)
    }

    /// Parses a condition whose names are looked up in `names` (the
    /// parameters of the probed function) besides `arg0`…`arg5`.
    pub fn parse_with(s: &str, names: NameMap<'_>) -> Result<Cond, CondError> {
        Cond::parse_names(s, Some(names))
    }

    /// Whether the condition names parameters (compiled per function
    /// once placed, [`named_cond`]) rather than `arg0`…`arg5` only; an
    /// error for a condition that does not parse whatever its names are.
    pub fn names_parameters(s: &str) -> Result<bool, CondError> {
        match Cond::parse(s) {
            Ok(_) => Ok(false),
            Err(CondError::UnknownName { .. }) => {
                // Every name stands for some parameter: what is left is
                // the syntax.
                let any = |_: &str| {
                    Some(Ok(Operand::Param {
                        reg: 0,
                        size: 8,
                        signed: true,
                    }))
                };
                Cond::parse_with(s, &any).map(|_| true)
            }
            Err(e) => Err(e),
        }
    }

    fn parse_names(s: &str, names: Option<NameMap<'_>>) -> Result<Cond, CondError> {
        Cond::parse_full(s, names, None)
    }

    fn parse_full(
        s: &str,
        names: Option<NameMap<'_>>,
        usdt: Option<&[hotprobe_symbols::UsdtArg]>,
    ) -> Result<Cond, CondError> {
        let toks = lex(s)?;
        let mut p = Parser {
            toks,
            at: 0,
            end: s.chars().count() + 1,
            names,
            usdt,
            depth: 0,
            terms: 0,
        };
        let c = p.or()?;
        if p.at < p.toks.len() {
            return Err(p.err("`&&`, `||` or the end"));
        }
        Ok(c)
    }

    /// Whether the condition holds for these argument values (a
    /// comparison with an argument not in `args` is false).
    pub fn eval(&self, args: &[u64]) -> bool {
        match self {
            Cond::Cmp(a, op, b) => {
                let v = |o: &Operand| -> Option<i128> {
                    match *o {
                        Operand::Arg(k) => args.get(k as usize).map(|&x| i128::from(x as i64)),
                        Operand::Param { reg, size, signed } => {
                            let x = *args.get(reg as usize)?;
                            let bits = u32::from(size.clamp(1, 8)) * 8;
                            let low = if bits == 64 {
                                x
                            } else {
                                x & ((1u64 << bits) - 1)
                            };
                            Some(if signed {
                                i128::from(((low << (64 - bits)) as i64) >> (64 - bits))
                            } else {
                                i128::from(low)
                            })
                        }
                        Operand::Const(c) => Some(i128::from(c)),
                    }
                };
                let (Some(x), Some(y)) = (v(a), v(b)) else {
                    return false;
                };
                match op {
                    Op::Eq => x == y,
                    Op::Ne => x != y,
                    Op::Lt => x < y,
                    Op::Le => x <= y,
                    Op::Gt => x > y,
                    Op::Ge => x >= y,
                }
            }
            Cond::And(a, b) => a.eval(args) && b.eval(args),
            Cond::Or(a, b) => a.eval(args) || b.eval(args),
            Cond::Not(a) => !a.eval(args),
        }
    }

    /// Arguments needed: 1 + the highest argN named (0 for none).
    pub fn args_needed(&self) -> u8 {
        match self {
            Cond::Cmp(a, _, b) => {
                let n = |o: &Operand| match *o {
                    Operand::Arg(k) | Operand::Param { reg: k, .. } => k + 1,
                    Operand::Const(_) => 0,
                };
                n(a).max(n(b))
            }
            Cond::And(a, b) | Cond::Or(a, b) => a.args_needed().max(b.args_needed()),
            Cond::Not(a) => a.args_needed(),
        }
    }
}

/// Compiles the condition `text` on the arguments of a USDT marker:
/// `arg1` … `argN` are its operands, as `trace` shows them, each compared
/// with its size and signedness from the note ([`Operand::Param`], whose
/// `reg` indexes the values [`usdt_values`] decodes).
pub fn usdt_cond(text: &str, args: &[hotprobe_symbols::UsdtArg]) -> Result<Cond, CondError> {
    Cond::parse_full(text, None, Some(args))
}

/// The values of a USDT marker's arguments from the bytes
/// [`crate::typed::usdt_capture`] captured at a hit, in order; `None`
/// for one that could not be read (memory not mapped, an operand the
/// capture does not read), and for all after bytes it does not know.
pub fn usdt_values(data: &[u8]) -> Vec<Option<u64>> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(&tag) = data.get(at) {
        let word = data
            .get(at + 1..at + 9)
            .and_then(|b| <[u8; 8]>::try_from(b).ok());
        match (tag, word) {
            // A value; an unreadable address.
            (0, Some(w)) => out.push(Some(u64::from_le_bytes(w))),
            (2, Some(_)) => out.push(None),
            // Not available.
            (3, _) => {
                out.push(None);
                at += 1;
                continue;
            }
            _ => break,
        }
        at += 9;
    }
    out
}

/// `spec` as an error message shows it: at most 80 characters, then `...`
/// (a condition thousands of parentheses deep is not echoed whole).
pub fn cut(spec: &str) -> String {
    match spec.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &spec[..i]),
        None => spec.to_string(),
    }
}

/// Splits `PROBE if CONDITION` into the probe spec and the condition text
/// (`if` surrounded by whitespace).
pub fn split_spec(spec: &str) -> (&str, Option<&str>) {
    let mut words = spec.split_whitespace();
    if words.clone().nth(1) != Some("if") {
        return (spec.trim(), None);
    }
    let probe = words.next().unwrap_or("");
    let at = spec
        .find(" if ")
        .or_else(|| spec.find("\tif\t"))
        .or_else(|| spec.find(" if\t"))
        .or_else(|| spec.find("\tif "))
        .unwrap_or(spec.len());
    let rest = spec.get(at + 4..).unwrap_or("");
    (probe, Some(rest.trim()))
}

#[cfg(test)]
#[path = "cond_tests.rs"]
mod tests;
