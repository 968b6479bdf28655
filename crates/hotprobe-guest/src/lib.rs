//! hotprobe-guest (being written).
