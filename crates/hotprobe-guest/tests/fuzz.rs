//! Bounded fuzz pass (hotprobe-fuzzcheck): the RSP streaming decoder and
//! every reply parser never panic, and chunked decoding agrees with
//! whole-buffer decoding. Same input encoding as the cargo-fuzz target
//! `rsp_decoder` in `fuzz/` (docs/FUZZING.md): the first byte picks the
//! chunk size, the rest is the byte stream from the stub.

#[path = "fuzz/exercise.rs"]
mod exercise;

use hotprobe_fuzzcheck::Fuzz;
use hotprobe_guest::rsp::{self, RegisterMap};

#[test]
fn fuzz_rsp_decoder() {
    let xml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/i386-64bit.xml"
    ))
    .unwrap();
    let mut g = vec![0u8; RegisterMap::qemu_x86_64().g_len()];
    RegisterMap::qemu_x86_64().write(&mut g, "rip", 0xffff_ffff_8100_0000);
    let replies: Vec<Vec<u8>> = vec![
        b"OK".to_vec(),
        b"E01".to_vec(),
        b"T05thread:p01.01;".to_vec(),
        b"T05thread:01;swbreak:;".to_vec(),
        b"S05".to_vec(),
        b"W00".to_vec(),
        b"X09".to_vec(),
        b"O48656c6c6f0a".to_vec(),
        b"mp01.01,p01.02".to_vec(),
        b"m1,2,3".to_vec(),
        b"l".to_vec(),
        b"QC1".to_vec(),
        b"PacketSize=1000;qXfer:features:read+;vContSupported+;multiprocess+;QStartNoAckMode-"
            .to_vec(),
        rsp::encode_hex(&g).into_bytes(),
        format!("l{xml}").into_bytes(),
        b"a}b$#*".to_vec(),
    ];
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    for (i, r) in replies.iter().enumerate() {
        let mut s = vec![i as u8];
        s.extend(b"+");
        s.extend(rsp::encode_packet(r));
        seeds.push(s);
    }
    // A whole conversation, a notification, run-length encoding, an
    // interrupt byte and a bad checksum.
    let mut conv = vec![3u8];
    for r in &replies[..13] {
        conv.extend(rsp::encode_packet(r));
        conv.push(b'+');
    }
    conv.extend(b"%Stop:T05thread:p01.01;#00$0* #7a\x03$OK#00-");
    seeds.push(conv);
    Fuzz::new("rsp_decoder")
        .seeds(seeds)
        .tokens([
            &b"$"[..],
            b"#",
            b"}",
            b"*",
            b"%",
            b"+",
            b"-",
            b"\x03",
            b";",
            b":",
            b"thread:",
            b"p-1.-1",
            b"<reg ",
            b"bitsize=\"",
            b"regnum=\"",
            b"<!--",
            b"-->",
            b"l",
            b"m",
        ])
        .iterations(20_000)
        .run(exercise::rsp_decoder);
}
