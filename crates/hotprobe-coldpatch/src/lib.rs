//! hotprobe-coldpatch (being written).
