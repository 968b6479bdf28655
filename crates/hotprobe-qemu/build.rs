//! Builds hotprobe's QEMU plugin (`hotprobe-qemu-plugin`, a cdylib,
//! release profile) into `$OUT_DIR/libhotprobe_qemu_plugin.so`, where
//! `src/lib.rs` embeds it: a `hotprobe` binary carries its plugin and
//! writes it to a memfd that QEMU loads as `/proc/HOTPROBE_PID/fd/N`. How:
//! `hotprobe-embed`, as for the fast path's agent.
//!
//! `HOTPROBE_EMBED_QEMU_PLUGIN=/path/to/libhotprobe_qemu_plugin.so` embeds
//! a prebuilt library instead.

fn main() {
    hotprobe_embed::build(&hotprobe_embed::Embedded {
        package: "hotprobe-qemu-plugin",
        file: "libhotprobe_qemu_plugin.so",
        prebuilt_env: "HOTPROBE_EMBED_QEMU_PLUGIN",
        sources: &["hotprobe-qemu-plugin", "hotprobe-abi"],
    });
}
