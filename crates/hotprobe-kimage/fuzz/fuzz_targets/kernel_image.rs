//! Feeds arbitrary bytes to every entry point of hotprobe-kimage: as a
//! whole image, as a compressed payload, as a vmlinux to search for
//! kallsyms, and wrapped in a minimal bzImage header. None may panic.
//! Seed the corpus with `../tests/data/pattern.*` and the head of a real
//! bzImage.
#![no_main]

use hotprobe_kimage::{decompress, kallsyms::Kallsyms, kernel_symbols, vmlinux_symbols};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = kernel_symbols(data);
    let _ = decompress(data, None);
    if let Ok(k) = Kallsyms::find(data) {
        assert!(!k.symbols.is_empty());
    }
    let _ = vmlinux_symbols(data);

    // The same bytes as the payload of a bzImage (boot protocol 2.15).
    let mut img = vec![0u8; 3 * 512];
    img[0x1f1] = 2;
    img[0x202..0x206].copy_from_slice(b"HdrS");
    img[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
    img[0x24c..0x250].copy_from_slice(&(data.len() as u32).to_le_bytes());
    img.extend_from_slice(data);
    let _ = kernel_symbols(&img);
});
