//! Glob-ish name patterns: `*` matches any run of characters, `?` one
//! character; everything else matches itself.

/// Whether `pattern` contains a wildcard.
pub fn is_pattern(pattern: &str) -> bool {
    pattern.contains(['*', '?'])
}

/// Whether `name` matches `pattern` as a whole.
pub fn matches(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // Iterative matcher with backtracking to the last `*`.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(c) if *c == '?' || *c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
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
}
