//! A module mapped is told to every mechanism (`TargetChange::ModuleMapped`
//! at the loader's rendezvous), and the trap mechanism's reaction is to
//! place the unwinder hooks (`nonlocal`). Here the unwinder is not in the
//! process when the return probe goes in: a C program (no libgcc_s; the
//! session is trap-only, so no agent is preloaded either) gets a trap
//! return probe on `through`, then dlopens a C++ library (which brings
//! libstdc++ and libgcc_s) whose exceptions unwind through `through`'s
//! frame. Without the hooks the unwinder would read the
//! return trampoline as that frame's return address and terminate the
//! program; with them the program prints what it prints without hotprobe,
//! and the probe counts the calls that returned and the frames unwound.

mod nonlocal_support;

use hotprobe::{MechanismChoice, RetProbe, RunEnd, Session, SessionConfig, SpawnOptions};
use nonlocal_support::native_output;
use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;

/// `run(through, n)` calls `through(i)` for i = 0 .. n; `thrower(i)`
/// throws `i` when it is odd, which `run` catches.
const LIBRARY: &str = r#"
extern "C" void thrower(int i) {
    if (i % 2)
        throw i;
}

extern "C" int run(void (*cb)(int), int n) {
    int caught = 0;
    for (int i = 0; i < n; i++) {
        try {
            cb(i);
        } catch (int) {
            caught++;
        }
    }
    return caught;
}
"#;

/// Calls the library's `thrower` through its own `through`, 10 times,
/// after dlopening the library named by `argv[1]`.
const PROGRAM: &str = r#"
#include <dlfcn.h>
#include <stdio.h>

static void (*thrower)(int);
static volatile int returned;

__attribute__((noinline)) void through(int i) {
    thrower(i);
    returned++;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        printf("dlopen: %s\n", dlerror());
        return 1;
    }
    thrower = (void (*)(int))dlsym(h, "thrower");
    int (*run)(void (*)(int), int) = (int (*)(void (*)(int), int))dlsym(h, "run");
    int caught = run(through, 10);
    printf("caught=%d returned=%d\n", caught, returned);
    return 0;
}
"#;

/// The library and the program, built in the test's tmp dir.
fn build() -> (PathBuf, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("unwinder_dlopen");
    let lib = hotprobe_testkit::write_source(&dir, "thrower.cc", LIBRARY);
    let lib = hotprobe_testkit::compile(
        "g++",
        &lib,
        &dir.join("libthrower.so"),
        &["-O1", "-shared", "-fPIC"],
        &[],
    );
    let prog = hotprobe_testkit::write_source(&dir, "through.c", PROGRAM);
    let prog = hotprobe_testkit::compile(
        "gcc",
        &prog,
        &dir.join("through"),
        &["-O1", "-g"],
        &["-ldl"],
    );
    (lib, prog)
}

#[test]
fn unwinder_hooks_are_placed_when_the_unwinder_is_mapped_after_the_return_probe() {
    let (lib, prog) = build();
    let lib = lib.to_str().unwrap();
    let want = native_output(&prog, &[lib]);
    assert_eq!(want, "caught=5 returned=5\n");

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("unwinder_dlopen");
    let out = dir.join("out");
    let mut s = Session::with_config(SessionConfig {
        mechanism: MechanismChoice::Trap,
        ..SessionConfig::default()
    });
    let t = s
        .spawn_with(
            &prog,
            &[lib.into()],
            &SpawnOptions {
                stdout: Some(std::fs::File::create(&out).unwrap()),
                ..Default::default()
            },
        )
        .unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", s.pid(t).unwrap())).unwrap();
    assert!(
        !maps.contains("libgcc_s"),
        "the unwinder must come with the dlopen, not before: {maps}"
    );
    let rets = Rc::new(Cell::new(0u64));
    let seen = rets.clone();
    let id = s
        .retprobe(
            t,
            "through",
            RetProbe::new(16).ret(move |_| seen.set(seen.get() + 1)),
        )
        .unwrap();
    s.start().unwrap();
    assert_eq!(s.run().unwrap(), RunEnd::AllExited);
    assert_eq!(s.exit_status(t), Some(hotprobe::ExitStatus::Code(0)));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), want);
    let st = s.stats(id).unwrap();
    assert_eq!(
        (st.hits, st.returns, st.nmissed, st.abandoned),
        (10, 5, 0, 5)
    );
    assert_eq!(rets.get(), 5);
}
