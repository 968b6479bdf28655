//! hotprobe-symbols (being written).
