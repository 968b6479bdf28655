//! hotprobe-abi (being written).
