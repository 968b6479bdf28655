//! Round trips through the OS layer's shared memory and futex: what one
//! mapping writes, the memfd holds and a second mapping reads; a sealed
//! memfd holds its bytes and refuses every change; a wake through one
//! mapping of a memfd reaches a waiter on another (the futex is keyed by
//! the file, not by our address space: the agent and the plugin are other
//! processes).

use hotprobe_os::{futex_wait, futex_wake, FutexWaited, Mapping, Memfd};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const LEN: usize = 2 * 4096;

/// A fresh memfd of `LEN` bytes and two mappings of it.
fn two_mappings() -> (Memfd, Mapping, Mapping) {
    let m = Memfd::new("hotprobe-os-test").expect("memfd");
    m.set_len(LEN as u64).expect("ftruncate");
    let a = Mapping::shared(&m, LEN).expect("mmap a");
    let b = Mapping::shared(&m, LEN).expect("mmap b");
    assert_ne!(a.as_ptr(), b.as_ptr(), "two mappings at two addresses");
    assert_eq!(a.len(), LEN);
    (m, a, b)
}

/// The `AtomicU32` at byte `off` of a mapping.
fn word(map: &Mapping, off: usize) -> &AtomicU32 {
    assert!(off + 4 <= map.len() && off.is_multiple_of(4));
    // SAFETY: in bounds, aligned, and the mapping outlives the borrow; all
    // accesses to the word in these tests are atomic.
    unsafe { AtomicU32::from_ptr(map.as_ptr().add(off).cast()) }
}

#[test]
fn a_write_through_one_mapping_is_in_the_file_and_the_other_mapping() {
    let (m, a, b) = two_mappings();
    // A fresh memfd reads as zeros.
    assert_eq!(word(&b, 4096).load(Ordering::SeqCst), 0);
    word(&a, 4096).store(0xdead_beef, Ordering::SeqCst);
    word(&a, 8).store(42, Ordering::SeqCst);
    assert_eq!(word(&b, 4096).load(Ordering::SeqCst), 0xdead_beef);
    assert_eq!(word(&b, 8).load(Ordering::SeqCst), 42);
    // Another process would open it by this path: read it that way.
    let mut bytes = Vec::new();
    std::fs::File::open(m.proc_path())
        .expect("open /proc/self/fd/N")
        .read_to_end(&mut bytes)
        .expect("read");
    assert_eq!(bytes.len(), LEN);
    assert_eq!(&bytes[8..12], &42u32.to_ne_bytes());
    assert_eq!(&bytes[4096..4100], &0xdead_beefu32.to_ne_bytes());
    assert!(bytes[..8].iter().chain(&bytes[12..4096]).all(|&x| x == 0));
    // Dropping one mapping leaves the other and the file as they were.
    drop(a);
    assert_eq!(word(&b, 4096).load(Ordering::SeqCst), 0xdead_beef);
}

#[test]
fn a_sealed_memfd_holds_its_bytes_and_refuses_changes() {
    let payload: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
    let m = Memfd::sealed_executable("hotprobe-os-sealed", &payload).expect("sealed memfd");
    let mut back = Vec::new();
    std::fs::File::open(m.proc_path())
        .expect("open")
        .read_to_end(&mut back)
        .expect("read");
    assert_eq!(back, payload);
    let e = m
        .write_all(b"more")
        .expect_err("F_SEAL_WRITE refuses writes");
    assert_eq!((e.call, e.errno()), ("write", libc::EPERM), "{e}");
    let e = m.set_len(1).expect_err("F_SEAL_SHRINK refuses shrinking");
    assert_eq!((e.call, e.errno()), ("ftruncate", libc::EPERM), "{e}");
    let e = m.set_len(1 << 20).expect_err("F_SEAL_GROW refuses growing");
    assert_eq!(e.errno(), libc::EPERM, "{e}");
    let e = Mapping::shared(&m, 4096).expect_err("no writable shared mapping");
    assert_eq!((e.call, e.errno()), ("mmap", libc::EPERM), "{e}");
    // Through the path, as a target opens it: read-only is all it gets.
    let w = std::fs::OpenOptions::new()
        .write(true)
        .open(m.proc_path())
        .and_then(|mut f| f.write_all(b"x"));
    assert!(w.is_err(), "a write through the path was taken");
}

#[test]
fn an_unsealed_memfd_is_not_sealed() {
    let m = Memfd::executable("hotprobe-os-open").expect("memfd");
    m.write_all(b"abc").expect("write");
    m.write_all(b"def").expect("write appends");
    let mut back = String::new();
    std::fs::File::open(m.proc_path())
        .expect("open")
        .read_to_string(&mut back)
        .expect("read");
    assert_eq!(back, "abcdef");
    m.set_len(4096).expect("no seal yet");
    m.seal().expect("seal");
    assert_eq!(m.set_len(8192).expect_err("sealed").errno(), libc::EPERM);
}

#[test]
fn futex_wait_returns_at_once_when_the_word_differs_and_times_out_otherwise() {
    let (_m, a, _b) = two_mappings();
    let w = word(&a, 0);
    w.store(5, Ordering::SeqCst);
    assert_eq!(futex_wait(w, 4, None).expect("wait"), FutexWaited::Changed);
    assert_eq!(
        futex_wait(w, 5, Some(Duration::from_millis(1))).expect("wait"),
        FutexWaited::TimedOut
    );
    // Nobody waits: a wake wakes nobody.
    assert_eq!(futex_wake(w, u32::MAX).expect("wake"), 0);
}

#[test]
fn a_wake_through_one_mapping_reaches_a_waiter_on_the_other() {
    let (_m, a, b) = two_mappings();
    std::thread::scope(|s| {
        // The word stays 0: only a wake ends the wait (or the timeout,
        // which fails the test).
        let waiter = s.spawn(|| futex_wait(word(&a, 64), 0, Some(Duration::from_secs(20))));
        let deadline = Instant::now() + Duration::from_secs(20);
        let woken = loop {
            // 0 until the waiter sleeps; then 1, through the other mapping.
            let n = futex_wake(word(&b, 64), 1).expect("wake");
            if n > 0 || Instant::now() > deadline {
                break n;
            }
            std::thread::yield_now();
        };
        assert_eq!(woken, 1, "no waiter on the other mapping was woken");
        assert_eq!(waiter.join().unwrap().expect("wait"), FutexWaited::Woken);
    });
}

/// A futex word of a shared mapping given to `wake_on_child`: a child's
/// exit (a wait status of this process) bumps it and wakes a sleeper on
/// it, through the waiter thread, the status left in place for its owner
/// (`WNOWAIT`: the child is still there to reap, with its exit code). A
/// word whose guard was dropped is never written, even for a status that
/// comes later.
#[test]
fn a_childs_exit_rings_a_word_given_to_wake_on_child_and_no_dropped_one() {
    let (_m, a, b) = two_mappings();
    let (rung, dropped) = (word(&a, 64), word(&a, 128));
    // Given, then dropped before any child of this test ends. Until the
    // drop the waiter may bump it (a `waitid` that finds no child at all
    // returns ECHILD at once, and that wakes too); after it, never.
    drop(hotprobe_os::wake_on_child(dropped).expect("a waiter thread"));
    let at_drop = dropped.load(Ordering::SeqCst);
    let seen = rung.load(Ordering::SeqCst);
    let wake = hotprobe_os::wake_on_child(rung).expect("a waiter thread");
    let mut child = std::process::Command::new("sh")
        .args(["-c", "exit 7"])
        .spawn()
        .expect("sh");
    // Sleeps on the other mapping's word (the same file): ends when the
    // waiter bumps it (a bound of a minute, far past any wake).
    let mut waited = Vec::new();
    while word(&b, 64).load(Ordering::SeqCst) == seen && waited.len() < 60 {
        waited.push(futex_wait(word(&b, 64), seen, Some(Duration::from_secs(1))).unwrap());
    }
    assert_ne!(rung.load(Ordering::SeqCst), seen, "rung: {waited:?}");
    assert!(wake.fired());
    drop(wake);
    // The status stayed for its owner.
    assert_eq!(child.wait().unwrap().code(), Some(7));
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        at_drop,
        "a dropped word is not written"
    );
}
