//! Guest kernel symbols from the kernel image alone (`hotprobe-kimage`):
//! those recovered from the cached Debian bzImage equal what the booted
//! guest prints from /proc/kallsyms (nokaslr), and a probe placed with them
//! counts exactly the workload's calls. One boot (≈ 10–20 s under TCG).

#[path = "guest/harness.rs"]
mod harness;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use harness::{workspace_root, Guest};
use hotprobe::{Action, Session};
use hotprobe_guest::{
    is_kernel_image, load_symbols, open_guest, symbols_from_kernel_image, GuestConfig, StubAddr,
};

const LONG: Duration = Duration::from_secs(120);

/// `(address, type, name)` of the core-kernel lines of kallsyms text.
fn parse_kallsyms(text: &str) -> Vec<(u64, char, String)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [a, t, n] if t.len() == 1 => Some((
                    u64::from_str_radix(a, 16).ok()?,
                    t.chars().next()?,
                    n.to_string(),
                )),
                _ => None, // module symbols ([name]) and other lines
            }
        })
        .collect()
}

#[test]
fn symbols_from_the_kernel_image_match_the_guest() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!(
            "\n!!!!!!!! SKIPPED symbols_from_the_kernel_image_match_the_guest: {why} !!!!!!!!\n"
        );
        return;
    }
    let kernel = workspace_root().join(".cache/kernel/vmlinuz");
    // A cache of our own (the only test in this binary: no other thread reads
    // the environment).
    let cache = std::env::temp_dir().join(format!("hotprobe-image-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    std::env::set_var("XDG_CACHE_HOME", &cache);

    // Boot in the background while the symbols are recovered.
    let booting = std::thread::spawn(|| Guest::boot("image"));

    let image = std::fs::read(&kernel).unwrap();
    assert!(is_kernel_image(&image));
    let t0 = Instant::now();
    let recovered = hotprobe_kimage::kernel_symbols(&image).expect("symbols from the image");
    let uncached = t0.elapsed();
    assert_eq!(recovered.source, hotprobe_kimage::SymbolSource::Kallsyms);
    let t0 = Instant::now();
    let (syms, text) = load_symbols(&kernel).expect("load_symbols takes a bzImage");
    let first = t0.elapsed();
    let t0 = Instant::now();
    let again = symbols_from_kernel_image(&kernel).expect("from the cache");
    let cached = t0.elapsed();
    eprintln!(
        "FIGURE kimage: {} symbols recovered in {uncached:?} (kernel_symbols); \
         load_symbols {first:?} (recovery + cache write); from the cache {cached:?}",
        recovered.symbols.len()
    );
    assert!(
        std::fs::read_dir(cache.join("hotprobe")).unwrap().count() == 1,
        "one cache file"
    );
    assert_eq!(syms.len(), again.len());
    assert!(syms
        .symbols()
        .iter()
        .zip(again.symbols())
        .all(|(a, b)| a.name == b.name && a.addr == b.addr));

    let mut guest = booting.join().unwrap();
    eprintln!("guest booted to READY in {:?}", guest.boot_time);
    let guest_text = std::fs::read_to_string(guest.kallsyms_file()).unwrap();
    let listed = parse_kallsyms(&guest_text);

    // Every text symbol the guest lists is recovered, same address and type.
    let ours: HashSet<(u64, char, &str)> = recovered
        .symbols
        .iter()
        .map(|s| (s.addr, s.kind, s.name.as_str()))
        .collect();
    let guest_text_syms: Vec<&(u64, char, String)> = listed
        .iter()
        .filter(|(_, t, _)| matches!(t, 't' | 'T'))
        .collect();
    let missing: Vec<_> = guest_text_syms
        .iter()
        .filter(|(a, t, n)| !ours.contains(&(*a, *t, n.as_str())))
        .take(10)
        .collect();
    assert!(
        missing.is_empty(),
        "guest text symbols not recovered: {missing:x?}"
    );
    let our_text = recovered
        .symbols
        .iter()
        .filter(|s| matches!(s.kind, 't' | 'T'))
        .count();
    eprintln!(
        "text symbols: guest {}, recovered {our_text}",
        guest_text_syms.len()
    );
    assert_eq!(our_text, guest_text_syms.len(), "same count of t/T symbols");

    // Named symbols: exact addresses (the harness keeps the first of a name).
    let by_name: HashMap<&str, u64> = recovered
        .symbols
        .iter()
        .rev()
        .map(|s| (s.name.as_str(), s.addr))
        .collect();
    for name in [
        "__x64_sys_getppid",
        "__x64_sys_openat",
        "_stext",
        "_etext",
        "do_sys_openat2",
        "start_kernel",
    ] {
        assert_eq!(
            by_name.get(name).copied(),
            Some(guest.sym(name)),
            "{name} from the image vs the guest"
        );
        assert_eq!(syms.lookup(name).unwrap().addr.0, guest.sym(name), "{name}");
    }
    assert_eq!(text, Some((guest.sym("_stext"), guest.sym("_etext"))));

    // Count getppid with the symbols from the image only.
    let mut s = Session::new();
    let cfg = GuestConfig::new(StubAddr::Unix(guest.gdb_socket.clone()));
    let (target, resolver) = open_guest(cfg, syms).unwrap();
    let id = s.add_target(Box::new(target), Some(Box::new(resolver)));
    s.engine(id).unwrap().set_step_unsupported_in_place(true);
    let added = s.add(id, "__x64_sys_getppid", Action::Count).unwrap();
    assert_eq!(added.placements.len(), 1);
    let p = added.placements[0].id;
    s.start().unwrap();
    let n = 25;
    guest.send_line(&format!("getppid {n}"));
    let done = format!("@getppid {n} done");
    let deadline = Instant::now() + LONG;
    while !guest.seen(&done) {
        assert!(Instant::now() < deadline, "{done:?} never came");
        let _ = s
            .engine(id)
            .unwrap()
            .poll(Some(Duration::from_millis(20)))
            .expect("healthy");
    }
    assert_eq!(
        s.stats(p).unwrap().hits,
        n,
        "count == the workload's getppid calls"
    );
    s.detach().unwrap();
    guest.send_line("getppid 2");
    guest.wait_for("@getppid 2 done", LONG);
    let _ = std::fs::remove_dir_all(&cache);
}
