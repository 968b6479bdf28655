//! Prints where a kernel image's kernel keeps its current task (from BTF):
//! `cargo run -p hotprobe-kimage --example task_offsets -- IMAGE`.
fn main() {
    let path = std::env::args().nth(1).expect("usage: task_offsets IMAGE");
    let bytes = std::fs::read(&path).expect("read the image");
    match hotprobe_kimage::task_offsets(&bytes) {
        Ok(o) => println!("{o:?}"),
        Err(e) => eprintln!("{path}: {e}"),
    }
}
