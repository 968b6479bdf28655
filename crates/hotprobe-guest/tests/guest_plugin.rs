//! hotprobe's QEMU plugin on the test guest (smoke).

#[path = "guest/harness.rs"]
mod harness;

use std::process::Stdio;
use std::time::Duration;

use harness::Console;
use hotprobe_qemu::{Delivery, PluginConfig, PluginHost, PluginProbe, QemuCommand};

#[test]
fn plugin_counts_getppid() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let ksyms = harness::kallsyms_cached();
    let text = std::fs::read_to_string(&ksyms).unwrap();
    let getppid = text
        .lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            let a = it.next()?;
            let _ = it.next()?;
            (it.next()? == "__x64_sys_getppid").then(|| u64::from_str_radix(a, 16).unwrap())
        })
        .unwrap();
    let mut host = PluginHost::create(PluginConfig::default()).unwrap();
    let p = host
        .add_probe(&PluginProbe {
            delivery: Delivery::Count,
            sites: vec![getppid],
            enabled: false,
            ..PluginProbe::default()
        })
        .unwrap();
    host.freeze();
    let dir = std::env::temp_dir().join(format!("hp-plugin-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let args = harness::qemu_args(&dir, "");
    let mut q = QemuCommand::new(&args)
        .unwrap()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn(&host)
        .unwrap();
    q.kill_on_drop = true;
    let mut con = Console::new(q.child.stdin.take(), q.child.stdout.take().unwrap());
    let mon = dir.join("monitor.sock");
    std::thread::sleep(Duration::from_millis(300));
    harness::monitor_command(&mon, "cont");
    con.wait_for("@READY", Duration::from_secs(120));
    host.set_enabled(p, true).unwrap();
    con.send_line("getppid 1000");
    con.wait_for("@getppid 1000 done", Duration::from_secs(60));
    let c = host.counts(p);
    eprintln!("counts {c:?} stats {:?}", host.stats());
    assert_eq!(c.hits, 1000);
}
