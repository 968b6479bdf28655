//! Bounded fuzz pass (hotprobe-fuzzcheck): the RSP streaming decoder and
//! every reply parser never panic, and chunked decoding agrees with
//! whole-buffer decoding. Same input encoding as the cargo-fuzz target
//! `rsp_decoder` in `fuzz/` (docs/FUZZING.md): the first byte picks the
//! chunk size, the rest is the byte stream from the stub.

use hotprobe_fuzzcheck::Fuzz;
use hotprobe_guest::rsp::{self, Decoder, Features, Frame, RegisterMap, StopReply, ThreadRef};

fn decode_all(bytes: &[u8], step: usize) -> Vec<Result<Frame, rsp::DecodeError>> {
    let mut d = Decoder::new();
    for c in bytes.chunks(step) {
        d.feed(c);
    }
    let mut out = Vec::new();
    while let Some(f) = d.next_frame() {
        out.push(f);
    }
    let _ = (d.skipped(), d.in_frame());
    out
}

fn exercise(data: &[u8]) -> bool {
    let Some((&split, bytes)) = data.split_first() else {
        return false;
    };
    let whole = decode_all(bytes, bytes.len().max(1));
    let chunked = decode_all(bytes, usize::from(split % 7) + 1);
    assert_eq!(whole, chunked, "chunking changed the decoding");
    let qemu = RegisterMap::qemu_x86_64();
    let mut packets = 0;
    for f in whole.into_iter().flatten() {
        let (Frame::Packet(p) | Frame::Notification(p)) = f else {
            continue;
        };
        packets += 1;
        let _ = StopReply::parse(&p);
        let _ = Features::parse(&p).has("multiprocess");
        let _ = rsp::parse_thread_list(&p);
        if let Ok(t) = ThreadRef::parse(&p) {
            let _ = t.encode();
        }
        if let Ok(g) = rsp::decode_hex(&p) {
            let regs = qemu.registers(&g);
            let mut back = g.clone();
            qemu.store(&mut back, &regs);
        }
        let _ = rsp::parse_hex_u64(&p);
        let doc = rsp::parse_target_doc(&String::from_utf8_lossy(&p));
        let map = RegisterMap::from_regs(doc.regs);
        let mut g = vec![0u8; map.g_len().min(4096)];
        let regs = map.registers(&g);
        map.store(&mut g, &regs);
        let _ = rsp::unescape(&p);
    }
    let _ = rsp::unescape(bytes);
    packets > 0
}

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
        .run(exercise);
}
