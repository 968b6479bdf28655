//! Feeds random bytes, split into random chunks, to the RSP streaming decoder
//! and every reply parser: none may panic, and whole-buffer and chunked
//! decoding must agree.
#![no_main]

use hotprobe_guest::rsp::{self, Decoder, Features, RegisterMap, StopReply, ThreadRef};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split_seed, bytes)) = data.split_first() else {
        return;
    };

    let mut whole = Decoder::new();
    whole.feed(bytes);
    let mut a = Vec::new();
    while let Some(f) = whole.next_frame() {
        a.push(f);
    }

    let mut chunked = Decoder::new();
    let step = usize::from(split_seed % 7) + 1;
    for c in bytes.chunks(step) {
        chunked.feed(c);
    }
    let mut b = Vec::new();
    while let Some(f) = chunked.next_frame() {
        b.push(f);
    }
    assert_eq!(a, b, "chunking changed the decoding");

    for f in a.into_iter().flatten() {
        if let rsp::Frame::Packet(p) | rsp::Frame::Notification(p) = f {
            let _ = StopReply::parse(&p);
            let _ = Features::parse(&p);
            let _ = rsp::parse_thread_list(&p);
            let _ = ThreadRef::parse(&p);
            let _ = rsp::decode_hex(&p);
            let _ = rsp::parse_hex_u64(&p);
            let map = RegisterMap::qemu_x86_64();
            let _ = map.registers(&p);
            let doc = rsp::parse_target_doc(&String::from_utf8_lossy(&p));
            let _ = RegisterMap::from_regs(doc.regs).g_len();
        }
    }
    let _ = rsp::unescape(bytes);
});
