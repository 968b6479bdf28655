#![no_main]
//! ELF parsing never panics on arbitrary bytes: symbols, lookups, DWARF
//! lines, PLT and segment queries.

use hotprobe_symbols::{ElfModule, LinkAddr, Mapping, Perms, RuntimeAddr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = ElfModule::from_bytes("fuzz.elf".into(), data.to_vec()) else {
        return;
    };
    let _ = m.is_pie();
    let _ = m.entry();
    let _ = m.build_id();
    let _ = m.plt_ranges();
    let _ = m.exec_ranges();
    let names: Vec<String> = m.functions().iter().take(8).map(|s| s.name.clone()).collect();
    for n in &names {
        let s = m.lookup(n).expect("a listed function can be looked up");
        let _ = m.symbolize(s.addr);
        let _ = m.source_location(s.addr);
    }
    let _ = m.lookup("main");
    let _ = m.symbolize(LinkAddr(0x1000));
    let _ = m.line_addresses("a.c", 1);
    let map = Mapping {
        start: RuntimeAddr(0x5555_5555_4000),
        end: RuntimeAddr(0x5555_5555_5000),
        perms: Perms {
            read: true,
            write: false,
            exec: true,
            shared: false,
        },
        offset: 0x1000,
        dev: (0, 0),
        inode: 1,
        path: None,
        pseudo: None,
        deleted: false,
    };
    let _ = m.load_bias(&map);
    let _ = m.load_bias_for([&map]);
});
