//! Exporters to formats existing tools open.

mod chrome;
mod ctf;
mod folded;

pub use chrome::{export_chrome, ChromeStats};
pub use ctf::{export_ctf, CtfStats};
pub use folded::{export_folded, FoldedOptions, FoldedValue};
