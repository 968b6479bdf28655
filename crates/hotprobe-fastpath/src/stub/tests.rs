//! The stubs' instructions, as text, and their templates.

use super::*;
use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};

/// A record entry stub's parameters, which each test changes where it
/// looks.
fn params() -> StubParams {
    StubParams {
        tpoff: (-16i64) as u64,
        counter: 7,
        probe: 5,
        kind: StubKind::Entry,
        record: true,
        generic: 0x4000,
        event_size: EVENT_SIZE_FULL,
        key: 0x7fff_0001,
        missed_offset: 0x3000,
        xmm_ints: None,
        hook: false,
    }
}

fn text(code: &[u8], ip: u64) -> String {
    let mut dec = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let mut f = IntelFormatter::new();
    let mut out = String::new();
    for ins in &mut dec {
        f.format(&ins, &mut out);
        out.push('\n');
    }
    out
}

#[test]
fn count_stub_reads_tls_and_increments_one_counter() {
    let p = StubParams {
        tpoff: (-8i64) as u64,
        counter: 3,
        probe: 3,
        record: false,
        generic: 0x1122_3344_5566_7788,
        key: 0x1234_5678,
        ..params()
    };
    let code = build(0x1000, &p).unwrap();
    let t = text(&code, 0x1000);
    assert!(
        t.starts_with("push r11\nmov r11,fs:[0FFFFFFFFFFFFFFF8h]\ntest r11,r11\nje "),
        "{t}"
    );
    assert!(t.contains("inc qword ptr [r11+18h]"), "{t}");
    assert!(t.contains("cmp dword ptr [r11+38h],12345678h\njne "), "{t}");
    assert!(code.ends_with(&0x1122_3344_5566_7788u64.to_le_bytes()));
}

/// The record stub's stores into the slot (`[r10...]`), as text.
fn slot_stores(t: &str) -> Vec<&str> {
    t.lines()
        .filter(|l| l.starts_with("mov qword ptr [r10") || l.starts_with("mov [r10"))
        .collect()
}

#[test]
fn record_stub_writes_only_the_words_the_slot_uses_and_publishes_head() {
    // (kind, slot size, words stored: tsc, meta, values; log2 of the size)
    let cases = [
        (StubKind::Entry, EVENT_SIZE_FULL, 8, 6),
        (StubKind::Entry, EVENT_SIZE_COMPACT, 4, 5),
        (StubKind::Exit, EVENT_SIZE_FULL, 4, 6),
        (StubKind::Exit, EVENT_SIZE_COMPACT, 4, 5),
    ];
    for (kind, event_size, words, shift) in cases {
        let p = StubParams {
            kind,
            event_size,
            ..params()
        };
        let code = build(0x2000, &p).unwrap();
        let t = text(&code, 0x2000);
        let stores = slot_stores(&t);
        assert_eq!(stores.len(), words, "{kind:?} {event_size}: {t}");
        // Words 0..words, each once (in any order).
        for i in 0..words {
            let off = match 8 * i {
                0 => "[r10],".to_string(),
                o if o < 10 => format!("[r10+{o}],"),
                o => format!("[r10+{o:X}h],"),
            };
            let n = stores.iter().filter(|s| s.contains(&off)).count();
            assert_eq!(n, 1, "word {i} ({off}): {t}");
        }
        assert!(t.contains(&format!("shl r10,{shift}")), "{t}");
        assert!(!t.contains("imul"), "{t}");
        assert!(t.contains("rdtsc"), "{t}");
        // Key and busy checked with one compare before anything else.
        assert!(t.contains("cmp qword ptr [r11+38h],7FFF0001h\njne "), "{t}");
        // Head published last, after the tsc.
        let tsc = t.find("mov [r10],rax").expect("tsc store");
        let publish = t.find("inc qword ptr [r10]").expect("head publish");
        assert!(tsc < publish, "{t}");
        // The line 256 bytes ahead asked for, wrapped in the ring
        // (mask << shift | size - 1), before the publish.
        let ahead = t.find("prefetchw [rax]").expect("prefetch ahead");
        assert!(tsc < ahead && ahead < publish, "{t}");
        assert!(t.contains("add rax,100h\n"), "{t}");
        assert!(
            t.contains(&format!(
                "shl rdx,{shift}\nor rdx,{:X}h\nand rax,rdx",
                event_size - 1
            )),
            "{t}"
        );
        // The meta word's immediate: probe 5, the kind, the values.
        let (k, n) = match kind {
            StubKind::Entry => (KIND_ENTRY, if event_size == 64 { 6 } else { 2 }),
            StubKind::Exit => (KIND_EXIT, 2),
        };
        let meta = pack_meta(5, k, n, 0);
        assert!(
            t.contains(&format!("mov qword ptr [r10+8],{meta:X}h")),
            "{meta:#x}: {t}"
        );
        // The values come straight from their registers.
        let first = match kind {
            StubKind::Entry => "mov [r10+10h],rdi",
            StubKind::Exit => "mov [r10+10h],rax",
        };
        assert!(t.contains(first), "{t}");
    }
}

#[test]
fn xmm_layout_stores_ints_then_xmm_registers_and_flags_the_event() {
    let base = StubParams {
        counter: 2,
        probe: 9,
        key: 0x10,
        xmm_ints: Some(2),
        ..params()
    };
    let t = text(&build(0x2000, &base).unwrap(), 0x2000);
    let stores = slot_stores(&t);
    let want = [
        "mov [r10+10h],rdi",
        "mov [r10+18h],rsi",
        "movq [r10+20h],xmm0",
        "movq [r10+28h],xmm1",
        "movq [r10+30h],xmm2",
        "movq [r10+38h],xmm3",
    ];
    for line in want {
        assert!(t.contains(line), "{line}: {t}");
    }
    // tsc, meta and the six values: nothing else written to the slot.
    let movq = t.lines().filter(|l| l.starts_with("movq [r10")).count();
    assert_eq!(stores.len() + movq, 8, "{t}");
    let meta = pack_meta(9, KIND_ENTRY, 6, EVENT_XMM);
    assert!(
        t.contains(&format!("mov qword ptr [r10+8],{meta:X}h")),
        "{t}"
    );
    // No xmm register is written: the program's values stay.
    assert!(!t.lines().any(|l| l.starts_with("movq xmm")), "{t}");
    let exit = StubParams {
        kind: StubKind::Exit,
        ..base
    };
    let t = text(&build(0x2000, &exit).unwrap(), 0x2000);
    assert!(t.contains("mov [r10+10h],rax"), "{t}");
    assert!(t.contains("mov [r10+18h],rdx"), "{t}");
    assert!(t.contains("movq [r10+20h],xmm0"), "{t}");
    let meta = pack_meta(9, KIND_EXIT, 3, EVENT_XMM);
    assert!(
        t.contains(&format!("mov qword ptr [r10+8],{meta:X}h")),
        "{t}"
    );
    // Compact slots cannot carry it.
    let compact = StubParams {
        event_size: EVENT_SIZE_COMPACT,
        ..base
    };
    assert!(build(0x2000, &compact).is_err());
}

#[test]
fn hook_stub_hooks_the_return_before_counting_and_declines_with_nothing_done() {
    let p = StubParams {
        probe: 0x1234,
        event_size: EVENT_SIZE_COMPACT,
        key: 0x55,
        hook: true,
        ..params()
    };
    let t = text(&build(0x2000, &p).unwrap(), 0x2000);
    let at = |needle: &str| t.find(needle).unwrap_or_else(|| panic!("{needle}: {t}"));
    // Recording on and a hook published, checked before anything is
    // changed; busy set before the call, which gets the function's
    // return-address slot (above the 4 saved registers and the key)
    // and the probe id.
    let key = at("cmp qword ptr [r11+38h],55h\njne ");
    let control = at("test byte ptr [r10+48h],2\nje ");
    let published = at("cmp qword ptr [r11+28h],0\nje ");
    let busy = at("mov dword ptr [r11+3Ch],1\n");
    let call = at("lea r10,[rsp+28h]\nmov eax,1234h\ncall qword ptr [r11+28h]\ntest eax,eax\nje ");
    assert!(key < control && control < published && published < busy && busy < call);
    // Hooked: rdx (an argument the event records) reloaded, then the
    // counter and the event as in the plain record stub.
    let count = at("mov rdx,[rsp+8]\nmov r10,[r11]\ninc qword ptr [r10+38h]");
    assert!(call < count, "{t}");
    assert_eq!(t.matches("inc qword ptr [r10+38h]").count(), 1, "{t}");
    assert!(t.contains("mov [r10+10h],rdi"), "{t}");
    assert!(t.contains("rdtsc"), "{t}");
    // Declined: busy cleared, the three registers restored, then the
    // generic path (pop r11, jump through the literal).
    let declined = at("mov dword ptr [r11+3Ch],0\njmp ");
    assert!(call < declined, "{t}");
    assert!(
        t.contains("pop r10\npop rdx\npop rax\npop r11\njmp qword ptr "),
        "{t}"
    );
    // Only an entry record stub without xmm values hooks.
    for bad in [
        StubParams {
            kind: StubKind::Exit,
            ..p
        },
        StubParams { record: false, ..p },
        StubParams {
            xmm_ints: Some(1),
            event_size: EVENT_SIZE_FULL,
            ..p
        },
    ] {
        assert!(build(0x2000, &bad).is_err(), "{bad:?}");
    }
}

#[test]
fn stub_refuses_what_the_slot_cannot_carry() {
    let p = StubParams {
        tpoff: 8,
        counter: 0,
        probe: 1 << 24,
        key: 1,
        ..params()
    };
    assert!(build(0x2000, &p).is_err());
    assert!(build(
        0x2000,
        &StubParams {
            probe: 1,
            event_size: 72,
            ..p
        }
    )
    .is_err());
    assert!(build(
        0x2000,
        &StubParams {
            probe: 1,
            key: 0,
            ..p
        }
    )
    .is_err());
    assert!(build(0x2000, &StubParams { probe: 1, ..p }).is_ok());
}

#[test]
fn templates_give_the_bytes_assembly_gives() {
    let mut t = StubTemplates::default();
    for record in [false, true] {
        for (kind, hook) in [
            (StubKind::Entry, false),
            (StubKind::Exit, false),
            (StubKind::Entry, true),
        ] {
            if hook && !record {
                continue;
            }
            for (event_size, xmm_ints) in [
                (EVENT_SIZE_COMPACT, None),
                (EVENT_SIZE_FULL, None),
                (EVENT_SIZE_FULL, Some(2)),
            ] {
                if xmm_ints.is_some() && (!record || hook) {
                    continue;
                }
                for (counter, probe) in [
                    (0, 0),
                    (3, 3),
                    (15, 15),
                    (16, 16),
                    (17, 99),
                    (1000, 1000),
                    (99_999, 99_999),
                    (1 << 20, (1 << 24) - 1),
                ] {
                    let p = StubParams {
                        tpoff: (-40i64) as u64,
                        counter,
                        probe,
                        kind,
                        record,
                        generic: 0x7f00_1234_5678,
                        event_size,
                        key: 0x2345_6789,
                        missed_offset: 0x40_0000,
                        xmm_ints,
                        hook,
                    };
                    let want = build(0x5555_0000_1000, &p).unwrap();
                    let got = t.build(&p).unwrap();
                    assert_eq!(got, want, "{p:?}");
                }
            }
        }
    }
    // Every shape without an xmm layout had a template; those with one
    // are assembled (and still equal, above).
    assert!(t
        .shapes
        .iter()
        .all(|(p, t)| t.is_some() == p.xmm_ints.is_none()));
}
