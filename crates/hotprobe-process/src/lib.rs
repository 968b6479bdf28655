//! hotprobe-process (being written).
