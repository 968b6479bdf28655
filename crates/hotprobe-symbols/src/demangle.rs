//! Demangling of Rust and C++ symbol names, and the name forms a lookup
//! accepts.

/// Longest mangled name this crate tries to demangle; longer ones are kept
/// as they are (pathological names can make demanglers slow).
const MAX_DEMANGLE_LEN: usize = 4096;

/// Which language's mangling a raw name uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mangling {
    Rust,
    Cpp,
    None,
}

fn strip_llvm_suffix(raw: &str) -> &str {
    // Suffixes such as ".llvm.1234", ".cold", ".isra.0" follow the mangled part.
    match raw.find('.') {
        Some(i) if i > 0 => &raw[..i],
        _ => raw,
    }
}

fn is_rust_legacy_hash(raw: &str) -> bool {
    // _ZN...17h<16 hex digits>E
    let core = strip_llvm_suffix(raw);
    let Some(body) = core.strip_suffix('E') else {
        return false;
    };
    if body.len() < 19 || !body.is_char_boundary(body.len() - 19) {
        return false;
    }
    let tail = &body[body.len() - 19..];
    tail.starts_with("17h") && tail[3..].bytes().all(|b| b.is_ascii_hexdigit())
}

fn mangling(raw: &str) -> Mangling {
    if raw.len() > MAX_DEMANGLE_LEN {
        Mangling::None
    } else if raw.starts_with("_R") || (raw.starts_with("_ZN") && is_rust_legacy_hash(raw)) {
        Mangling::Rust
    } else if raw.starts_with("_Z") {
        Mangling::Cpp
    } else {
        Mangling::None
    }
}

/// The raw name without an ELF symbol version (`malloc@@GLIBC_2.2.5` ->
/// `malloc`).
pub(crate) fn strip_version(raw: &str) -> &str {
    match raw.find('@') {
        Some(i) if i > 0 => &raw[..i],
        _ => raw,
    }
}

/// Demangle a Rust or C++ symbol name; other names come back unchanged.
///
/// Rust names keep their `::h<hash>` suffix here; ELF symbol versions
/// (`@GLIBC_2.2.5`) are kept too.
pub fn demangle(raw: &str) -> String {
    let base = strip_version(raw);
    match mangling(base) {
        Mangling::Rust => match rustc_demangle::try_demangle(base) {
            Ok(d) => d.to_string(),
            Err(_) => raw.to_string(),
        },
        Mangling::Cpp => {
            cpp(base, &cpp_demangle::DemangleOptions::new()).unwrap_or_else(|| raw.to_string())
        }
        Mangling::None => raw.to_string(),
    }
}

fn cpp(raw: &str, opts: &cpp_demangle::DemangleOptions) -> Option<String> {
    let sym = cpp_demangle::Symbol::new(raw.as_bytes()).ok()?;
    sym.demangle(opts).ok()
}

/// Every name under which a symbol can be looked up: the raw name, the raw
/// name without symbol version, the demangled name, the Rust name without its
/// hash and the C++ name without parameter list and return type.
pub(crate) fn lookup_keys(raw: &str, demangled: &str) -> Vec<String> {
    let mut keys = vec![raw.to_string()];
    let base = strip_version(raw);
    keys.push(base.to_string());
    keys.push(demangled.to_string());
    match mangling(base) {
        Mangling::Rust => {
            if let Ok(d) = rustc_demangle::try_demangle(base) {
                keys.push(format!("{d:#}"));
            }
        }
        Mangling::Cpp => {
            let opts = cpp_demangle::DemangleOptions::new()
                .no_params()
                .no_return_type();
            if let Some(short) = cpp(base, &opts) {
                keys.push(short);
            }
        }
        Mangling::None => {}
    }
    keys.sort();
    keys.dedup();
    keys
}

/// The shortest human form of a symbol name (for suggestions): the Rust name
/// without hash, the C++ name without parameters, the C name without version.
pub(crate) fn short_name(raw: &str) -> String {
    let base = strip_version(raw);
    match mangling(base) {
        Mangling::Rust => match rustc_demangle::try_demangle(base) {
            Ok(d) => format!("{d:#}"),
            Err(_) => base.to_string(),
        },
        Mangling::Cpp => {
            let opts = cpp_demangle::DemangleOptions::new()
                .no_params()
                .no_return_type();
            cpp(base, &opts).unwrap_or_else(|| base.to_string())
        }
        Mangling::None => base.to_string(),
    }
}

/// Up to `max` names from `candidates` that look like `wanted`: names that
/// contain it (or are contained in it) first, then the closest by edit
/// distance.
pub(crate) fn similar_names<'a>(
    wanted: &str,
    candidates: impl Iterator<Item = &'a str>,
    max: usize,
) -> Vec<String> {
    let w = wanted.to_ascii_lowercase();
    let mut scored: Vec<(usize, String)> = Vec::new();
    for c in candidates {
        let lc = c.to_ascii_lowercase();
        if lc.len() > 256 {
            continue;
        }
        let score = if lc == w {
            0
        } else if lc.contains(&w) || (lc.len() >= 3 && w.contains(&lc)) {
            1 + lc.len().abs_diff(w.len()) / 4
        } else {
            let d = levenshtein(&w, &lc);
            // Only suggest names that are reasonably close.
            if d > (w.len() / 3).max(2) {
                continue;
            }
            3 + d
        };
        scored.push((score, c.to_string()));
    }
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().take(max).map(|(_, n)| n).collect()
}

fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_and_cpp() {
        let rust = "_ZN4core3fmt5write17h0123456789abcdefE";
        assert_eq!(demangle(rust), "core::fmt::write::h0123456789abcdef");
        assert!(lookup_keys(rust, &demangle(rust)).contains(&"core::fmt::write".to_string()));
        let cxx = "_ZN2ns4funcEi";
        assert_eq!(demangle(cxx), "ns::func(int)");
        assert!(lookup_keys(cxx, &demangle(cxx)).contains(&"ns::func".to_string()));
        assert_eq!(demangle("malloc@@GLIBC_2.2.5"), "malloc@@GLIBC_2.2.5");
        assert!(lookup_keys("malloc@@GLIBC_2.2.5", "malloc@@GLIBC_2.2.5")
            .contains(&"malloc".to_string()));
        assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
        assert_eq!(demangle("@"), "@");
    }

    /// Bounded fuzz pass (hotprobe-fuzzcheck) over every entry point of
    /// this module: none may panic on any name.
    #[test]
    fn fuzz_demangle() {
        let names = [
            "_ZN4core3fmt5write17h0123456789abcdefE",
            "_ZN4core3fmt5write17h0123456789abcdefE.llvm.1234",
            "_RNvCs1234_7mycrate3foo",
            "_RINvNtCs9ltgdHTiPiY_4core3ptr13drop_in_placeNtNtCsbDqzXfLQacH_5alloc6string6StringEB7_",
            "_ZN2ns4funcEi",
            "_ZNSt6vectorIiSaIiEE9push_backERKi",
            "_ZZN2ns3sumERKSt6vectorIiSaIiEEENKUliE_clEi",
            "_ZNK2ns3BoxIlE3getEv.cold",
            "_ZN9__gnu_cxx13new_allocatorIcE8allocateEmPKv@@GLIBCXX_3.4",
            "malloc@@GLIBC_2.2.5",
            "_Zgarbage",
            "@",
            "main",
        ];
        hotprobe_fuzzcheck::Fuzz::new("demangle")
            .seeds(names)
            .tokens([
                "_Z", "_ZN", "_R", "17h", "E", "@", ".", "S_", "T_", "I", "St", "Ul",
            ])
            .iterations(30_000)
            .run(|data| {
                let raw = String::from_utf8_lossy(data);
                let d = demangle(&raw);
                let keys = lookup_keys(&raw, &d);
                assert!(keys.contains(&raw.to_string()));
                let short = short_name(&raw);
                let _ = similar_names(&short, keys.iter().map(String::as_str), 3);
                d != raw
            });
    }

    #[test]
    fn similar() {
        let names = ["malloc", "calloc", "realloc", "free", "main"];
        let s = similar_names("maloc", names.iter().copied(), 5);
        assert_eq!(s.first().map(String::as_str), Some("malloc"));
        assert!(!s.contains(&"free".to_string()));
    }
}
