//! hotprobe-x86 (being written).
