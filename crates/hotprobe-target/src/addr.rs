//! Typed addresses: mixing a link-time address with a run-time one is a
//! compile error.

use std::fmt;
use std::ops::{Add, Sub};

macro_rules! addr_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub u64);

        impl fmt::LowerHex for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }

        impl $name {
            /// This address moved by `off` bytes (wrapping).
            pub fn offset(self, off: i64) -> Self {
                $name(self.0.wrapping_add(off as u64))
            }
        }
    };
}

addr_type!(
    /// An address as the ELF file states it (st_value, DWARF low_pc).
    LinkAddr
);
addr_type!(
    /// An address in a running target (process or guest virtual).
    RuntimeAddr
);
addr_type!(
    /// How far a module was loaded from its link-time addresses.
    LoadBias
);
addr_type!(
    /// A guest-virtual address (as the guest kernel sees it).
    GuestVirt
);
addr_type!(
    /// A guest-physical address (offset into guest RAM).
    GuestPhys
);

impl Add<LoadBias> for LinkAddr {
    type Output = RuntimeAddr;
    fn add(self, bias: LoadBias) -> RuntimeAddr {
        RuntimeAddr(self.0.wrapping_add(bias.0))
    }
}

impl Sub<LoadBias> for RuntimeAddr {
    type Output = LinkAddr;
    fn sub(self, bias: LoadBias) -> LinkAddr {
        LinkAddr(self.0.wrapping_sub(bias.0))
    }
}

impl From<GuestVirt> for RuntimeAddr {
    fn from(v: GuestVirt) -> Self {
        RuntimeAddr(v.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_round_trip() {
        let bias = LoadBias(0x5555_5555_4000);
        let link = LinkAddr(0x1139);
        let rt = link + bias;
        assert_eq!(rt, RuntimeAddr(0x5555_5555_5139));
        assert_eq!(rt - bias, link);
        assert_eq!(format!("{rt}"), "0x555555555139");
    }
}
