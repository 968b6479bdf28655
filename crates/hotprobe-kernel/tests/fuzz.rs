//! Bounded fuzz pass (hotprobe-fuzzcheck): the perf ring's records (an
//! untrusted byte stream) and tracepoint `format` files parse to records
//! or an error, never a panic; the records pair into well-formed spans.
//! Same input handling as the cargo-fuzz target `perf_ring` in `fuzz/`
//! (docs/FUZZING.md).

#[path = "fuzz/exercise.rs"]
mod exercise;

use hotprobe_fuzzcheck::Fuzz;
use hotprobe_kernel::records::{encode_record, KernelRecord, Stamp};

fn at(tid: u32, time: u64) -> Stamp {
    Stamp { pid: 10, tid, time }
}

/// A ring as a blocking read leaves it: enter, switch out and in, exit,
/// a lost record, another thread's call.
fn ring_seed() -> Vec<u8> {
    let l = exercise::layout();
    let mut b = vec![0u8];
    for r in [
        KernelRecord::Enter {
            at: at(11, 100),
            nr: 0,
        },
        KernelRecord::SwitchOut {
            at: at(11, 110),
            preempted: false,
        },
        KernelRecord::Enter {
            at: at(12, 120),
            nr: 39,
        },
        KernelRecord::Exit {
            at: at(12, 130),
            nr: 39,
            ret: 10,
        },
        KernelRecord::SwitchIn { at: at(11, 300) },
        KernelRecord::Exit {
            at: at(11, 310),
            nr: 0,
            ret: 1,
        },
        KernelRecord::Lost { count: 4 },
    ] {
        b.extend(encode_record(&r, &l));
    }
    b
}

#[test]
fn fuzz_perf_ring() {
    let mut format = vec![1u8];
    format.extend_from_slice(
        b"name: sys_exit\nID: 442\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
          \tfield:long id;\toffset:8;\tsize:8;\tsigned:1;\n\tfield:long ret;\toffset:16;\tsize:8;\tsigned:1;\n",
    );
    Fuzz::new("perf_ring")
        .seed(ring_seed())
        .seed(format)
        .tokens([
            &b"field:"[..],
            b"offset:",
            b"size:",
            b"ID: ",
            &9u32.to_le_bytes(),
            &14u32.to_le_bytes(),
            &2u32.to_le_bytes(),
            &0x2000u16.to_le_bytes(),
        ])
        .iterations(20_000)
        .run(exercise::perf_ring);
}
