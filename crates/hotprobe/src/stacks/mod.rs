//! Stacks at a hit (issue 24): the tracer's side. [`cfi`] compiles a
//! module's `.eh_frame` into the rows the agent walks
//! ([`hotprobe_abi::stacks`]); [`publish`] writes them, with the stack
//! mappings, into a process's stacks region and reads the captured
//! stacks back; [`trap`] walks the stacks of trap probes in the tracer; [`names`]
//! names the stack of one recorded call.

pub mod cfi;
pub mod names;
pub mod publish;
pub mod trap;

pub use cfi::{compile_module, CfiError};
pub use names::{CallStack, StackNames};
pub use publish::{
    frame_name, read_stacks, RefreshReport, StackCount, StackTables, StackTotals, StacksError,
};
pub use trap::{TrapStacks, TRAP_STACK_ID};
