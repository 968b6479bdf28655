//! What the fuzz pass does with one input, shared by the bounded pass of
//! `tests/fuzz.rs` and the cargo-fuzz target `rsp_decoder` of `fuzz/`
//! (included there by path). Depends on hotprobe-guest and std only.

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

/// The first byte picks a chunk size, the rest is the byte stream from the
/// stub: decoded whole and in chunks (which must agree), then every packet
/// goes through every reply parser and the register maps. True if a packet
/// was decoded.
pub fn rsp_decoder(data: &[u8]) -> bool {
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
