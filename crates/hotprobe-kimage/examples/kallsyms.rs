//! Prints a kernel image's symbols as `/proc/kallsyms` text, with timings
//! on stderr: `cargo run --release -p hotprobe-kimage --example kallsyms -- IMAGE [VMLINUX]`
//! (a bzImage's decompressed vmlinux is written to VMLINUX if given).

use std::time::Instant;

fn main() {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: kallsyms IMAGE (a bzImage or an ELF vmlinux)");
        std::process::exit(2);
    };
    let t0 = Instant::now();
    let image = std::fs::read(&path).unwrap_or_else(|e| {
        eprintln!("cannot read {}: {e}", path.to_string_lossy());
        std::process::exit(1);
    });
    let t_read = t0.elapsed();
    let result = if hotprobe_kimage::is_bzimage(&image) {
        let bz = hotprobe_kimage::BzImage::parse(&image);
        bz.and_then(|bz| {
            eprintln!(
                "boot protocol {}.{:02}, {} payload of {} bytes at {:#x}",
                bz.protocol.0,
                bz.protocol.1,
                bz.compression.name(),
                bz.payload.len(),
                bz.payload_start
            );
            let t = Instant::now();
            let v = bz.decompress()?;
            eprintln!("decompressed to {} bytes in {:?}", v.len(), t.elapsed());
            if let Some(out) = std::env::args_os().nth(2) {
                if let Err(e) = std::fs::write(&out, &v) {
                    eprintln!("cannot write {}: {e}", out.to_string_lossy());
                }
            }
            let t = Instant::now();
            let s = hotprobe_kimage::vmlinux_symbols(&v);
            eprintln!("symbols found in {:?}", t.elapsed());
            if let Ok(k) = hotprobe_kimage::kallsyms::Kallsyms::find(&v) {
                eprintln!("{:#x?}", k.layout);
            }
            s
        })
    } else {
        hotprobe_kimage::kernel_symbols(&image)
    };
    match result {
        Ok(k) => {
            eprintln!(
                "{} symbols from {:?}; read {t_read:?}, total {:?}",
                k.symbols.len(),
                k.source,
                t0.elapsed()
            );
            print!("{}", k.to_kallsyms_text());
        }
        Err(e) => {
            eprintln!("{}: {e}", path.to_string_lossy());
            std::process::exit(1);
        }
    }
}
