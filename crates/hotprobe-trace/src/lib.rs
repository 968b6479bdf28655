//! hotprobe-trace (being written).
