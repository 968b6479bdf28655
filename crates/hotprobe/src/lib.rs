//! hotprobe (being written).
