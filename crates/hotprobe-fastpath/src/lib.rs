//! hotprobe-fastpath (being written).
