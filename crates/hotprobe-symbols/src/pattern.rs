//! Name patterns (globs) over function names, the one matcher of hotprobe
//! (probe specs, `list`, `record --include/--exclude`, trace filters).
//!
//! - `*` matches any run of characters, `:` and `/` included (C++ names
//!   contain `::`);
//! - `?` matches exactly one character;
//! - `[abc]`, `[a-z]`, `[!abc]` (or `[^abc]`) match one character of (not
//!   of) a class; a `]` right after `[` (or `[!`) is a member;
//! - `\` makes the next character literal (`operator\[\]`);
//! - everything else matches itself, `{`, `}` and `,` included (they appear
//!   in names such as `{lambda()#1}` and `{{closure}}`, so there are no
//!   `{a,b}` alternatives).
//!
//! The pattern must match the whole name. Built on `globset`, which matches
//! bytes: so that `?` and classes still match one *character* of a name
//! that is not ASCII, every character outside printable ASCII is given one
//! byte of its own (see [`NamePattern`]).

use std::borrow::Cow;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A pattern that does not compile.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad name pattern {pattern:?}: {reason}")]
pub struct PatternError {
    /// The pattern as given.
    pub pattern: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Whether `s` is a pattern rather than a plain name: it contains `*`, `?`
/// or `[`.
pub fn is_pattern(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Whether `name` matches `pattern` as a whole. A pattern that does not
/// compile ([`NamePattern::new`] fails) matches only the name equal to it
/// (so `operator[]` still names itself). Compiled patterns are cached per
/// thread; for many names, compile a [`NamePattern`] once instead.
pub fn matches(pattern: &str, name: &str) -> bool {
    use std::cell::RefCell;
    use std::collections::HashMap;
    thread_local! {
        static CACHE: RefCell<HashMap<String, Option<NamePattern>>> =
            RefCell::new(HashMap::new());
    }
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if !c.contains_key(pattern) {
            if c.len() >= 256 {
                c.clear();
            }
            c.insert(pattern.to_string(), NamePattern::new(pattern).ok());
        }
        match c.get(pattern) {
            Some(Some(p)) => p.matches(name),
            _ => pattern == name,
        }
    })
}

/// The bytes that stand for characters outside printable ASCII: the ones the
/// pattern names get one each, in order; [`OTHER`] stands for every other.
const SLOTS: std::ops::RangeInclusive<u8> = 0x01..=0x1f;
/// The byte for a character outside printable ASCII that the pattern does
/// not name (only `*`, `?` and negated classes match it).
const OTHER: u8 = 0x7f;

fn is_plain(c: char) -> bool {
    (' '..='~').contains(&c)
}

/// A compiled name pattern (see the [module documentation](self)).
///
/// globset matches bytes, so before matching, a name's characters outside
/// printable ASCII (non-ASCII and control characters) are each replaced by
/// one byte: a byte of its own for each such character the pattern contains
/// (at most 31 distinct ones), one shared byte for the others; the pattern
/// is rewritten the same way when compiled. `?` and classes thus match one
/// character, and a character range in a class must have printable ASCII
/// ends.
#[derive(Clone, Debug)]
pub struct NamePattern {
    text: String,
    matcher: globset::GlobMatcher,
    /// The pattern's characters outside printable ASCII, by slot.
    special: Vec<char>,
}

impl NamePattern {
    /// Compile `pattern`.
    pub fn new(pattern: &str) -> Result<Self, PatternError> {
        let err = |reason: String| PatternError {
            pattern: pattern.to_string(),
            reason,
        };
        let mut special: Vec<char> = Vec::new();
        let mut slot = |c: char| -> Result<char, PatternError> {
            if is_plain(c) {
                return Ok(c);
            }
            let i = match special.iter().position(|s| *s == c) {
                Some(i) => i,
                None => {
                    special.push(c);
                    special.len() - 1
                }
            };
            SLOTS.clone().nth(i).map(char::from).ok_or_else(|| {
                err(format!(
                    "more than {} distinct characters outside printable ASCII",
                    SLOTS.len()
                ))
            })
        };
        // Rewrite for globset: escape `{`, `}` (no alternatives) and give
        // characters outside printable ASCII their byte. Classes are parsed
        // as globset parses them, to find their ranges.
        let mut out = String::with_capacity(pattern.len() + 8);
        let mut chars = pattern.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    out.push('\\');
                    if let Some(n) = chars.next() {
                        out.push(slot(n)?);
                    }
                }
                '{' | '}' => {
                    out.push('\\');
                    out.push(c);
                }
                '[' => {
                    out.push('[');
                    if let Some(n) = chars.next_if(|n| matches!(n, '!' | '^')) {
                        out.push(n);
                    }
                    let mut first = true;
                    // The previous member, if a `-` after it may start a range.
                    let mut prev: Option<char> = None;
                    // An unclosed class is left for globset to report.
                    while let Some(m) = chars.next() {
                        if m == ']' && !first {
                            out.push(']');
                            break;
                        }
                        if m == '-' && !first {
                            if let (Some(lo), Some(&hi)) = (prev, chars.peek()) {
                                if hi != ']' {
                                    if !is_plain(lo) || !is_plain(hi) {
                                        return Err(err(format!(
                                            "the range {lo}-{hi} must have printable ASCII ends"
                                        )));
                                    }
                                    out.push('-');
                                    out.push(hi);
                                    chars.next();
                                    prev = None;
                                    first = false;
                                    continue;
                                }
                            }
                        }
                        out.push(slot(m)?);
                        prev = Some(m);
                        first = false;
                    }
                }
                c => out.push(slot(c)?),
            }
        }
        let glob = globset::GlobBuilder::new(&out)
            .literal_separator(false)
            .backslash_escape(true)
            .build()
            .map_err(|e| err(e.kind().to_string()))?;
        Ok(NamePattern {
            text: pattern.to_string(),
            matcher: glob.compile_matcher(),
            special,
        })
    }

    /// The pattern as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `name` matches as a whole.
    pub fn matches(&self, name: &str) -> bool {
        let bytes: Cow<'_, [u8]> = if name.chars().all(is_plain) {
            Cow::Borrowed(name.as_bytes())
        } else {
            Cow::Owned(
                name.chars()
                    .map(|c| {
                        if is_plain(c) {
                            c as u8
                        } else {
                            self.special
                                .iter()
                                .position(|s| *s == c)
                                .and_then(|i| SLOTS.clone().nth(i))
                                .unwrap_or(OTHER)
                        }
                    })
                    .collect(),
            )
        };
        self.matcher.is_match(Path::new(OsStr::from_bytes(&bytes)))
    }
}

impl std::fmt::Display for NamePattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, n: &str) -> bool {
        NamePattern::new(p).unwrap().matches(n)
    }

    #[test]
    fn cli_globs() {
        assert!(matches("compute", "compute"));
        assert!(!matches("compute", "computer"));
        assert!(matches("comp*", "compute"));
        assert!(matches("*pute", "compute"));
        assert!(matches("*mp*", "compute"));
        assert!(matches("c?mpute", "compute"));
        assert!(matches("*", ""));
        assert!(!matches("a*b", "acbd"));
        assert!(matches("a*b*", "acbd"));
        assert!(matches("*a*a*a", "aaaa"));
    }

    #[test]
    fn trace_globs() {
        assert!(matches("*", ""));
        assert!(matches("foo*", "foobar"));
        assert!(matches("*bar", "foobar"));
        assert!(matches("f*o*r", "foobar"));
        assert!(matches("f?o", "foo"));
        assert!(!matches("f?o", "fo"));
        assert!(!matches("foo", "foobar"));
        assert!(matches("a*b*c", "aXbYbZc"));
        assert!(!matches("a*b*c", "aXbYbZ"));
    }

    #[test]
    fn question_mark_is_one_character() {
        // The old trace matcher compared bytes: `?` took one byte of `ä`.
        assert!(m("f?o", "fäo"));
        assert!(!m("f??o", "fäo"));
        assert!(m("??", "ä€"));
        assert!(!m("?", "ä€"));
        assert!(m("?", "😀"));
        assert!(m("[!x]", "ä"));
        assert!(m("[äö]x", "öx"));
        assert!(!m("[äö]x", "üx"));
        assert!(m("*ä", "€ä"));
        assert!(!m("*ä", "€ö"));
        assert!(m("\u{1}?", "\u{1}\u{2}"));
    }

    #[test]
    fn star_spans_separators_and_literal_stars() {
        assert!(m("ns::*", "ns::Foo::bar(int)"));
        assert!(m("*::bar*", "ns::Foo::bar(int)"));
        assert!(m("a*", "a/b/c"));
        assert!(m("**", "a/b"));
        assert!(m("*x", "a/b/x"));
        assert!(m("?", "/"));
        // The old trace matcher matched the name's `*` literally first and
        // never backtracked to the pattern's star.
        assert!(m("a*c", "a*bc"));
        assert!(m("*a", "*ba"));
        assert!(m("operator\\*", "operator*"));
        assert!(!m("operator\\*", "operator+"));
    }

    #[test]
    fn classes_braces_and_errors() {
        assert!(m("sys_[gs]et*", "sys_getppid"));
        assert!(m("sys_[gs]et*", "sys_setuid"));
        assert!(!m("sys_[!gs]et*", "sys_getppid"));
        assert!(m("f[a-c]", "fb"));
        assert!(!m("f[a-c]", "fd"));
        assert!(m("f[]]", "f]"));
        assert!(m("f[-a]", "f-"));
        assert!(m("f[a-]", "f-"));
        assert!(m("*{lambda()#1}*", "main::{lambda()#1}::operator()"));
        assert!(m("{{closure}}*", "{{closure}}::h12"));
        assert!(m("a,b*", "a,bc"));
        assert!(!m("{a,b}", "a"));
        for bad in ["f[ab", "f[z-a]", "x\\", "f[a-ä]"] {
            let e = NamePattern::new(bad).unwrap_err();
            assert_eq!(e.pattern, bad);
            assert!(e.to_string().contains(bad), "{e}");
        }
        // A pattern that does not compile matches only itself.
        assert!(matches("operator[]", "operator[]"));
        assert!(!matches("operator[]", "operator["));
    }

    #[test]
    fn detects_patterns() {
        assert!(is_pattern("comp*"));
        assert!(is_pattern("f?o"));
        assert!(is_pattern("f[ab]"));
        assert!(!is_pattern("compute"));
        assert!(!is_pattern("ns::f(int)"));
        assert!(!is_pattern("{lambda()#1}"));
    }
}
