//! Stacks at a hit (issue 24): the tracer's side. [`cfi`] compiles a
//! module's `.eh_frame` into the rows the agent walks
//! ([`hotprobe_abi::stacks`]).

pub mod cfi;

pub use cfi::{compile_module, CfiError};
