//! Exporters to formats existing tools open.

mod chrome;
mod ctf;
mod folded;

pub use chrome::{export_chrome, value_string, ChromeStats};
pub use ctf::{export_ctf, CtfStats};
pub use folded::{export_folded, folded_stacks, FoldedOptions, FoldedValue};
