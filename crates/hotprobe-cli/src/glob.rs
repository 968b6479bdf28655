//! Name patterns: `*` matches any run of characters, `?` one character,
//! `[abc]` one of a class; everything else matches itself. The matcher is
//! [`hotprobe_symbols::pattern`], shared with the resolvers and trace
//! filters.

pub use hotprobe_symbols::pattern::{is_pattern, matches};
