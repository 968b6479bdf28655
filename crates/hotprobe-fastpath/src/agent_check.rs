//! `HOTPROBE_AGENT` must name an ELF shared object for x86-64 (checked
//! with `object` before anything is loaded into a target).

use std::io::Read as _;
use std::path::Path;

/// Why the file at `path` is not an x86-64 ELF shared object (`ET_DYN`),
/// or `Ok` when it is.
pub(crate) fn check_agent_elf(path: &Path) -> Result<(), String> {
    use object::read::elf::FileHeader as _;
    let mut head = [0u8; 64];
    let mut n = 0;
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    if !head[..n].starts_with(b"\x7fELF") {
        return Err("not an ELF file (the agent is an ELF shared object)".into());
    }
    let h = object::elf::FileHeader64::<object::Endianness>::parse(&head[..n])
        .map_err(|_| "not a 64-bit ELF file (the agent is an x86-64 shared object)")?;
    let endian = h
        .endian()
        .map_err(|_| "an ELF file of unknown byte order".to_string())?;
    let ty = h.e_type(endian);
    if ty != object::elf::ET_DYN {
        let what = match ty {
            object::elf::ET_REL => "a relocatable object (ET_REL)",
            object::elf::ET_EXEC => "an executable (ET_EXEC)",
            object::elf::ET_CORE => "a core file (ET_CORE)",
            _ => "an ELF file of another type",
        };
        return Err(format!("{what}, not a shared object (ET_DYN)"));
    }
    let machine = h.e_machine(endian);
    if machine != object::elf::EM_X86_64 {
        return Err(format!(
            "an ELF shared object for machine {machine}, not x86-64"
        ));
    }
    // A position-independent executable is ET_DYN too: ld.so will not
    // preload it.
    let data = std::fs::read(path).map_err(|e| e.to_string())?;
    if is_pie(&data) {
        return Err("a position-independent executable (DF_1_PIE), not a shared object".into());
    }
    Ok(())
}

/// Whether the ELF file `data` says `DF_1_PIE` in its dynamic segment.
fn is_pie(data: &[u8]) -> bool {
    use object::read::elf::{Dyn as _, FileHeader as _, ProgramHeader as _};
    let Ok(h) = object::elf::FileHeader64::<object::Endianness>::parse(data) else {
        return false;
    };
    let Ok(endian) = h.endian() else { return false };
    let Ok(phdrs) = h.program_headers(endian, data) else {
        return false;
    };
    phdrs.iter().any(|ph| match ph.dynamic(endian, data) {
        Ok(Some(dyns)) => dyns.iter().any(|d| {
            d.d_tag(endian) == u64::from(object::elf::DT_FLAGS_1)
                && d.d_val(endian) & u64::from(object::elf::DF_1_PIE) != 0
        }),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_x86_64_shared_objects_pass() {
        let dir = std::env::temp_dir().join(format!("agent-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, bytes: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let text = file("passwd", b"root:x:0:0:root:/root:/bin/bash\n");
        assert_eq!(
            check_agent_elf(&text).unwrap_err(),
            "not an ELF file (the agent is an ELF shared object)"
        );
        assert!(check_agent_elf(&file("empty", b"")).is_err());
        // A 64-bit little-endian ELF header: type at 16, machine at 18.
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2; // ELFCLASS64
        h[5] = 1; // ELFDATA2LSB
        h[6] = 1; // EV_CURRENT
        h[16] = object::elf::ET_DYN as u8;
        h[18] = object::elf::EM_X86_64 as u8;
        assert_eq!(check_agent_elf(&file("ok.so", &h)), Ok(()));
        h[16] = object::elf::ET_EXEC as u8;
        assert_eq!(
            check_agent_elf(&file("exec", &h)).unwrap_err(),
            "an executable (ET_EXEC), not a shared object (ET_DYN)"
        );
        h[16] = object::elf::ET_DYN as u8;
        h[18] = object::elf::EM_AARCH64 as u8;
        assert_eq!(
            check_agent_elf(&file("arm.so", &h)).unwrap_err(),
            "an ELF shared object for machine 183, not x86-64"
        );
        h[4] = 1; // ELFCLASS32
        assert!(check_agent_elf(&file("x32.so", &h))
            .unwrap_err()
            .starts_with("not a 64-bit ELF file"));
        // A PIE (the test binary itself is one: cargo links PIEs) is
        // ET_DYN too, and refused.
        let me = std::env::current_exe().unwrap();
        assert_eq!(
            check_agent_elf(&me).unwrap_err(),
            "a position-independent executable (DF_1_PIE), not a shared object"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
