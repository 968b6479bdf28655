//! hotprobe-agent (being written).
