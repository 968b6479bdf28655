//! Issue 22: a program rebuilt at the same path while it runs. hotprobe
//! must read the code the process mapped (through the mapping), never the
//! new file now at that path: the probe counts, the program computes what
//! it computed before, and after detach its code is the old file's.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{file_offset_of, memory_at, mix_program, while_attached, CountTable};

/// The other program put at the same path: `mix` with a longer body.
const OTHER: &str = r#"
#include <stdio.h>
__attribute__((noinline)) int mix(int a, int b) {
    int pad[4] = {a, b, a, b};
    __asm__ volatile("" ::: "memory");
    return a * 3 + b + pad[a & 3];
}
int main(void) { printf("%d\n", mix(1, 2)); return 0; }
"#;

#[test]
fn a_program_rebuilt_at_its_path_is_probed_from_the_code_it_runs() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("replaced");
    std::fs::create_dir_all(&dir).unwrap();
    let original = mix_program();
    let old_bytes = std::fs::read(&original).unwrap();
    let path = dir.join("server");
    let _ = std::fs::remove_file(&path);
    std::fs::copy(&original, &path).unwrap();
    let mut server = Command::new(&path)
        .arg("lines")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = server.stdin.take().unwrap();
    let mut output = BufReader::new(server.stdout.take().unwrap()).lines();
    assert_eq!(output.next().unwrap().unwrap(), "ready");
    let mut ask = |n: u32| -> String {
        writeln!(input, "{n}").unwrap();
        output.next().unwrap().unwrap()
    };
    let before = ask(100);
    // Rebuilt at the same path: the old file is unlinked, a new one written.
    let src = hotprobe_testkit::write_source(&dir, "other.c", OTHER);
    std::fs::remove_file(&path).unwrap();
    let built = hotprobe_testkit::compile("gcc", &src, &dir.join("other"), &["-O1", "-g"], &[]);
    std::fs::copy(&built, &path).unwrap();
    let pid = server.id().to_string();
    // The request is made once hotprobe is attached (its probes are in);
    // it detaches when --duration ends.
    // Its probes are on jumps: it runs untraced meanwhile, as any
    // attached process does (before, a program whose file was replaced
    // counted as a library loaded at run time, its probes kept it traced
    // for good to watch an unload; libc's too, its start's libraries not
    // read from the program's file).
    let server_pid = server.id();
    let ((released, during), status, stdout, stderr) = while_attached(
        &["count", "-p", &pid, "--duration", "5", "mix", "libc:qsort"],
        || {
            let deadline = Instant::now() + Duration::from_secs(4);
            while !common::untraced(server_pid) && Instant::now() < deadline {
                std::thread::yield_now();
            }
            (common::untraced(server_pid), ask(100))
        },
    );
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(released, "still traced 4 s after the attach: {stderr}");
    assert!(both_on_jumps(&stdout, &stderr), "{stdout}\n{stderr}");
    assert_eq!(
        during, before,
        "the program computed something else under the probe"
    );
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.hits("mix"), 100, "{stdout}\n{stderr}");
    assert!(
        t.row("mix")
            .join(" ")
            .contains("5 bytes of relocatable instructions"),
        "planned from the new file: {stdout}"
    );
    // Detached: the code in memory is the old file's, and it still answers.
    let addr =
        u64::from_str_radix(t.row("mix")[t.col("ADDRESS")].trim_start_matches("0x"), 16).unwrap();
    let off = file_offset_of(server.id(), addr) as usize;
    assert_eq!(memory_at(server.id(), addr, 16), &old_bytes[off..off + 16]);
    assert_eq!(ask(100), before);
    drop(input);
    assert!(server.wait().unwrap().success());
}

/// Whether both probes of the table took a jump (nothing that keeps the
/// process traced by design).
fn both_on_jumps(stdout: &str, stderr: &str) -> bool {
    let t = CountTable::parse(stdout, stderr);
    ["mix", "libc:qsort"]
        .iter()
        .all(|p| t.execution(p).starts_with("jump"))
}
