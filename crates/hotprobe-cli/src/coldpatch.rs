//! `hotprobe coldpatch IN -o OUT`: iProbe's ColdPatch.

use crate::out::errln;
use anyhow::{Context, Result};
use std::path::Path;

/// Writes OUT (the instrumentation calls of IN turned into NOPs, same
/// behaviour) and OUT.probes (the probe list the patch mechanism reads).
pub fn run(input: &Path, output: &Path) -> Result<()> {
    let bytes = std::fs::read(input).with_context(|| format!("cannot read {}", input.display()))?;
    let (out, list) = hotprobe::coldpatch::coldpatch(&bytes)
        .with_context(|| format!("cannot coldpatch {}", input.display()))?;
    std::fs::write(output, out).with_context(|| format!("cannot write {}", output.display()))?;
    let mode = std::fs::metadata(input)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()))
        .unwrap_or(0o755);
    std::fs::set_permissions(output, std::os::unix::fs::PermissionsExt::from_mode(mode))
        .with_context(|| format!("cannot make {} executable", output.display()))?;
    let probes = hotprobe::fastpath::probe_list_path(output);
    std::fs::write(&probes, list.to_text())
        .with_context(|| format!("cannot write {}", probes.display()))?;
    errln!(
        "hotprobe: wrote {} and {} ({} sites)",
        output.display(),
        probes.display(),
        list.sites.len()
    );
    Ok(())
}
