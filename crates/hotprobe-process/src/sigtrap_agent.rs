//! The program's `SIGTRAP` action where an injected agent's handler holds
//! the kernel's disposition (issue 22; see `sigtrap.rs` and the agent's
//! `progtrap`).
//!
//! The agent keeps the program's action (handler, flags, restorer, mask:
//! the kernel's `struct sigaction`) in a block of its writable data that
//! starts with two magic words. An injected agent's program calls glibc's
//! `sigaction` directly (its interposer is not bound), whose
//! `rt_sigaction` system call stops at a signal-state site: for `SIGTRAP`
//! the target then reads and writes that block instead of the kernel's
//! disposition ([`ProcessTarget::emulate_trap_action`]), so the program
//! reads back what it set, and its handler is the one the agent chains to.

use hotprobe_target::{RuntimeAddr, Target};

use crate::ProcessTarget;

/// The block's first two words (the agent's `PROGRAM_SIGTRAP_MAGIC`).
const MAGIC: [u64; 2] = [
    u64::from_le_bytes(*b"hotprobe"),
    u64::from_le_bytes(*b"sigtrap1"),
];
/// Offset of the word that says the agent's handler holds the
/// disposition.
const HELD: u64 = 16;
/// Offset of the program's action (4 words).
const ACTION: u64 = 24;
/// Offset of the agent's own handler's address.
const AGENT_HANDLER: u64 = 56;
/// The largest agent mapping searched.
const MAX_SEARCH: u64 = 16 << 20;
/// `SIGKILL` and `SIGSTOP`, which the kernel never keeps in a handler's mask.
const UNBLOCKABLE: u64 = (1 << (libc::SIGKILL - 1)) | (1 << (libc::SIGSTOP - 1));
/// `EFAULT`, negated as a system call returns it.
const EFAULT: u64 = (-libc::EFAULT) as i64 as u64;

/// Where the block is in `text` (`/proc/PID/maps`): the writable
/// mappings of a file named like the agent.
fn agent_data(text: &str) -> Vec<(u64, u64)> {
    text.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let name = w.get(5..)?.join(" ");
            if !w.get(1)?.starts_with("rw") || !name.contains("hotprobe_agent") {
                return None;
            }
            let (s, e) = w[0].split_once('-')?;
            Some((
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
            ))
        })
        .collect()
}

/// The offset of the magic words (8-aligned) in `data`.
fn find_magic(data: &[u8]) -> Option<usize> {
    let want: Vec<u8> = MAGIC.iter().flat_map(|w| w.to_le_bytes()).collect();
    (0..data.len().saturating_sub(15))
        .step_by(8)
        .find(|&i| data[i..i + 16] == want[..])
}

impl ProcessTarget {
    /// The agent's block, when an agent is mapped (cached once found).
    fn agent_block(&mut self) -> Option<u64> {
        if let Some(b) = self.sigtrap.block {
            return Some(b);
        }
        let text = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).ok()?;
        for (start, end) in agent_data(&text) {
            if end - start > MAX_SEARCH {
                continue;
            }
            let mut data = vec![0u8; (end - start) as usize];
            if self.read_memory(RuntimeAddr(start), &mut data).is_err() {
                continue;
            }
            if let Some(off) = find_magic(&data) {
                let b = start + off as u64;
                self.sigtrap.block = Some(b);
                return Some(b);
            }
        }
        None
    }

    /// The agent's block, when its handler holds the kernel's `SIGTRAP`
    /// disposition.
    pub(crate) fn held_agent_block(&mut self) -> Option<u64> {
        let b = self.agent_block()?;
        (self.read_u64(RuntimeAddr(b + HELD)).ok()? == 1).then_some(b)
    }

    /// The agent's own `SIGTRAP` handler (of the agent at `block`).
    pub(crate) fn agent_handler(&mut self, block: u64) -> Option<u64> {
        self.read_u64(RuntimeAddr(block + AGENT_HANDLER)).ok()
    }

    /// The program's action the agent keeps at `block`.
    pub(crate) fn kept_action(&mut self, block: u64) -> Option<[u64; 4]> {
        let mut raw = [0u8; 32];
        self.read_memory(RuntimeAddr(block + ACTION), &mut raw)
            .ok()?;
        let w = |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        Some([w(0), w(1), w(2), w(3)])
    }

    /// Makes `action` the program's action the agent keeps at `block`.
    pub(crate) fn keep_action(&mut self, block: u64, action: [u64; 4]) -> bool {
        let bytes: Vec<u8> = action.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.write_memory(RuntimeAddr(block + ACTION), &bytes)
            .is_ok()
    }

    /// The program's `rt_sigaction(SIGTRAP, act, old, 8)` against the
    /// agent's block (see the module docs): the result the system call
    /// would give.
    pub(crate) fn emulate_trap_action(&mut self, block: u64, act: u64, old: u64) -> u64 {
        let Some(prev) = self.kept_action(block) else {
            return EFAULT;
        };
        let mut new = None;
        if act != 0 {
            let mut raw = [0u8; 32];
            if self.read_memory(RuntimeAddr(act), &mut raw).is_err() {
                return EFAULT;
            }
            let w =
                |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
            new = Some([w(0), w(1), w(2), w(3) & !UNBLOCKABLE]);
        }
        if old != 0 {
            let bytes: Vec<u8> = prev.iter().flat_map(|w| w.to_le_bytes()).collect();
            if self.write_memory(RuntimeAddr(old), &bytes).is_err() {
                return EFAULT;
            }
        }
        if let Some(a) = new {
            if !self.keep_action(block, a) {
                return EFAULT;
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_writable_mappings_are_searched() {
        let maps = "7f00-7f10 r--p 00000000 00:01 66 /memfd:libhotprobe_agent.so (deleted)\n\
                    7f10-7f20 rw-p 00060000 00:01 66 /memfd:libhotprobe_agent.so (deleted)\n\
                    7f20-7f30 rw-p 00000000 00:00 0 \n\
                    7f30-7f40 rw-p 00001000 fe:01 9 /usr/lib/libc.so.6\n";
        assert_eq!(agent_data(maps), vec![(0x7f10, 0x7f20)]);
    }

    #[test]
    fn the_block_is_found_by_its_magic_words() {
        let mut data = vec![0u8; 64];
        data[24..32].copy_from_slice(&MAGIC[0].to_le_bytes());
        data[32..40].copy_from_slice(&MAGIC[1].to_le_bytes());
        assert_eq!(find_magic(&data), Some(24));
        assert_eq!(find_magic(&data[..30]), None);
        assert_eq!(find_magic(&[]), None);
    }
}
