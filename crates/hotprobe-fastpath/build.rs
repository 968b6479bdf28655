//! Builds the agent library (`hotprobe-agent`, a cdylib, release profile)
//! into `$OUT_DIR/libhotprobe_agent.so`, where `src/lib.rs` embeds it
//! (`include_bytes!`): a `hotprobe` binary carries its agent and writes it
//! to a memfd at run time. How: `hotprobe-embed`.
//!
//! `HOTPROBE_EMBED_AGENT=/path/to/libhotprobe_agent.so` embeds a prebuilt
//! library instead (packaging, or a build without cargo at hand).

fn main() {
    hotprobe_embed::build(&hotprobe_embed::Embedded {
        package: "hotprobe-agent",
        file: "libhotprobe_agent.so",
        prebuilt_env: "HOTPROBE_EMBED_AGENT",
        sources: &["hotprobe-agent", "hotprobe-abi"],
    });
}
