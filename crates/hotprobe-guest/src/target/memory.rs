//! Guest memory: physical reads through the stub, paging, translation, virtual reads.

use super::*;

impl GuestTarget {
    pub(super) fn phys_read_stub(
        &mut self,
        addr: GuestPhys,
        buf: &mut [u8],
    ) -> Result<(), MemError> {
        let r = self
            .client
            .set_phys_mode(true)
            .and_then(|_| self.client.read_memory(addr.0, buf));
        let back = self.client.set_phys_mode(false);
        r.and(back).map_err(|e| MemError::Reader {
            addr: addr.0,
            why: e.to_string(),
        })
    }

    /// The paging registers (cr3, cr4) to walk kernel addresses with.
    pub(super) fn paging(&mut self) -> Result<(u64, u64), TargetError> {
        if let Some(p) = self.paging {
            return Ok(p);
        }
        let t = self.last_thread;
        self.read_regs(t)?;
        self.paging.ok_or_else(|| proto(&self.name, "no cr3"))
    }

    /// Translates a guest-virtual address by walking the guest's page tables
    /// (through the mapped RAM if any, else the stub in physical mode).
    pub fn translate(&mut self, virt: GuestVirt) -> Result<mem::Translation, TargetError> {
        self.check_alive()?;
        let (cr3, cr4) = self.paging()?;
        let r = match self.ram.as_mut() {
            Some(ram) => mem::translate(ram, cr3, cr4, virt),
            None => {
                let paused = self.pause()?;
                let r = {
                    let mut sp = StubPhys(self);
                    mem::translate(&mut sp, cr3, cr4, virt)
                };
                self.unpause(paused)?;
                r
            }
        };
        r.map_err(|e| proto(&self.name, e))
    }

    /// Reads guest-virtual memory through the stub (`m`) only.
    pub fn read_memory_stub(&mut self, addr: GuestVirt, buf: &mut [u8]) -> Result<(), TargetError> {
        self.check_alive()?;
        self.stats.stub_reads += 1;
        self.client.read_memory(addr.0, buf).map_err(|e| match e {
            GdbError::ErrorReply { .. } => TargetError::Memory {
                op: "read",
                addr: addr.0,
                len: buf.len(),
                target: self.name.clone(),
            },
            e => self.fail(e),
        })
    }

    /// Reads guest-virtual memory from the mapped RAM (page-table walk from
    /// the last cr3); an error if no RAM file is mapped or a page is absent.
    pub fn read_memory_direct(
        &mut self,
        addr: GuestVirt,
        buf: &mut [u8],
    ) -> Result<(), TargetError> {
        let (cr3, cr4) = self.paging()?;
        let name = self.name.clone();
        let ram = self
            .ram
            .as_mut()
            .ok_or_else(|| proto(&name, "no guest RAM file mapped"))?;
        mem::read_virt(ram, cr3, cr4, addr, buf).map_err(|e| proto(&name, e))?;
        self.stats.direct_reads += 1;
        Ok(())
    }

    /// Reads guest-physical memory (mapped RAM, else the stub in physical mode).
    pub fn read_physical(&mut self, addr: GuestPhys, buf: &mut [u8]) -> Result<(), TargetError> {
        self.check_alive()?;
        let r = match self.ram.as_mut() {
            Some(ram) => ram.read(addr, buf),
            None => self.phys_read_stub(addr, buf),
        };
        r.map_err(|e| proto(&self.name, e))
    }
}

struct StubPhys<'a>(&'a mut GuestTarget);

impl PhysMemory for StubPhys<'_> {
    fn read_phys(&mut self, addr: GuestPhys, buf: &mut [u8]) -> Result<(), MemError> {
        self.0.phys_read_stub(addr, buf)
    }
}
