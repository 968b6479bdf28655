//! Bounded fuzz passes (hotprobe-fuzzcheck, a few seconds each): the
//! parsers of untrusted input — DWARF types, shape lists, captured bytes,
//! argument expressions — never panic. The longer runs are the cargo-fuzz
//! targets in `fuzz/` (docs/FUZZING.md).

#[path = "fuzz/exercise.rs"]
mod exercise;

use hotprobe_fuzzcheck::Fuzz;
use std::path::PathBuf;
use std::process::Command;

const PROG: &str = r#"#include <stdio.h>
struct inner { int x; double y; };
struct buf { const char *name; unsigned long len; struct inner in; struct buf *next; };
enum color { RED, GREEN = 5 };
typedef const char *str_t;
static int helper(int a, int k) { return a * k; }
int use(struct buf *b, str_t s, enum color c, float f, double d, char ch, _Bool ok,
        short sh, long double ld, int arr[4]) {
    printf("%s %lu %d %g %g %c %d %d %Lg %d\n", s, b->len, c, f, d, ch, ok, sh, ld, arr[0]);
    return helper(b->in.x, 3);
}
int main(int argc, char **argv) {
    struct buf b = {argv[0], 1, {argc, 2.0}, 0};
    int arr[4] = {1, 2, 3, 4};
    return use(&b, "x", GREEN, 1.5f, 2.5, 'c', 1, 3, 4.0L, arr) + helper(argc, 3);
}
"#;

/// The program built with DWARF 5 and 4, -O0 and -O2, compressed sections:
/// built once for the tests of this binary, which run at once (each
/// building its own, under the same names, removed one another's).
fn seeds() -> Vec<Vec<u8>> {
    static BUILT: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_seeds).clone()
}

/// [`seeds`], built.
fn build_seeds() -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dwarf-fuzz");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("prog.c");
    std::fs::write(&src, PROG).unwrap();
    let mut out = Vec::new();
    for (i, flags) in [
        &["-g", "-O0"][..],
        &["-g", "-O2"],
        &["-g", "-O1", "-gdwarf-4"],
        &["-g", "-O2", "-gz"],
    ]
    .iter()
    .enumerate()
    {
        let exe = dir.join(format!("prog{i}-{}", std::process::id()));
        let st = Command::new("gcc")
            .args(*flags)
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .status()
            .expect("gcc runs");
        assert!(st.success());
        out.push(std::fs::read(&exe).unwrap());
        let _ = std::fs::remove_file(exe);
    }
    out
}

#[test]
fn fuzz_dwarf_types() {
    Fuzz::new("dwarf_types")
        .seeds(seeds())
        .tokens([
            &b".debug_info"[..],
            b".debug_abbrev",
            b".debug_loclists",
            b"buf",
        ])
        .iterations(3_000)
        .run(exercise::dwarf_types);
}

#[test]
fn fuzz_typed_values() {
    let mut v = b"=str;p->len=u8;=f64;=enum(0:RED,5:GREEN);=missing(optimised out)\n".to_vec();
    v.extend([1, 1, 3, 0, b'a', b'b', b'c', 0]);
    v.extend(7u64.to_le_bytes());
    v.push(0);
    v.extend(1.5f64.to_bits().to_le_bytes());
    v.extend([4, 3]);
    Fuzz::new("typed_values")
        .seed(v)
        .seed(&b"=i4;=char;=bool\n\x00\x01\x00\x00\x00\x00\x00\x00\x00\x02\x00\x10\x00\x00\x00\x00\x00\x00\x03"[..])
        .seed(&b"b->next->name:string"[..])
        .tokens([&b"enum("[..], b"missing(", b"->", b":string", b"=u8", b";"])
        .iterations(20_000)
        .run(exercise::typed_values);
}

/// The DWARF of a real program, read back: every type kind, parameters at
/// the entry under the ABI, a clone's constant.
#[test]
fn signatures_of_a_real_program() {
    let s = seeds();
    for (i, bytes) in s.iter().enumerate() {
        let d = hotprobe_dwarf::DebugTypes::from_bytes(bytes).unwrap();
        let sigs: Vec<_> = d
            .functions()
            .into_iter()
            .filter_map(|pc| d.signature(pc).unwrap())
            .collect();
        let used = sigs
            .iter()
            .find(|s| s.name == "use")
            .unwrap_or_else(|| panic!("{i}"));
        let p = hotprobe_dwarf::plan_auto(used, "use");
        let kinds = hotprobe_dwarf::Shape::encode_list(&p.entry_shapes);
        assert_eq!(
            kinds,
            "=ptr;=str;=enum(0:RED,5:GREEN);=f32;=f64;=char;=bool;=i2;\
             =missing(long double not supported);=missing(unknown location)",
            "build {i}"
        );
        assert_eq!(hotprobe_dwarf::Shape::encode_list(&p.exit_shapes), "=i4");
        let b = &used.params[0];
        let hotprobe_dwarf::Type::Pointer(to) = &b.ty else {
            panic!()
        };
        let hotprobe_dwarf::Type::Struct { fields, size, .. } = &**to else {
            panic!()
        };
        assert_eq!(*size, 40);
        let names: Vec<_> = fields.iter().map(|f| (f.name.as_str(), f.offset)).collect();
        assert_eq!(names, [("name", 0), ("len", 8), ("in", 16), ("next", 32)]);
        let e: hotprobe_dwarf::ArgExpr = "b->in.y".parse().unwrap();
        let p = hotprobe_dwarf::plan_args(used, "use", &[e]).unwrap();
        assert_eq!(
            p.entry[0],
            hotprobe_dwarf::Fetch::Load {
                addr: Box::new(hotprobe_dwarf::Fetch::Reg(hotprobe_dwarf::Source::IntArg(
                    0
                ))),
                offset: 24,
                size: 8
            }
        );
        assert!(
            hotprobe_dwarf::plan_args(used, "use", &["nope".parse().unwrap()])
                .unwrap_err()
                .to_string()
                .contains(
                    "use has no parameter nope; its parameters: b (struct buf *), s (char *)"
                )
        );
    }
}
