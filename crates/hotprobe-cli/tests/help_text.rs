//! What `hotprobe count --help` tells of the probes it takes: USDT
//! markers (`usdt:[MODULE:]PROVIDER:NAME`, issue 24) beside functions,
//! addresses and lines, and the whole condition syntax of `'SPEC if
//! CONDITION'` with every name a condition may use.

mod common;
use common::{hotprobe, text};

#[test]
fn count_help_names_usdt_probes_and_the_condition_syntax() {
    let o = hotprobe(&["count", "--help"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // clap wraps long help to the terminal; compare on single spaces.
    let help = text(&o.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for want in [
        // The spec forms.
        "[module:]function[+off]",
        "file.c:LINE",
        "usdt:[MODULE:]PROVIDER:NAME",
        "`list --usdt` lists them",
        "%return",
        // The condition: its operators and what an operand may be.
        "'SPEC if CONDITION'",
        "(== != < <= > >=)",
        "&& and ||",
        "negated with !",
        "parentheses",
        "signed 64-bit",
        "0x hex",
        "arg0..arg5",
        "rdi, rsi, rdx, rcx, r8, r9",
        "a parameter name of the function from its DWARF",
        "on a usdt: probe, arg1..argN",
        "'usdt:demo:tick if arg1 > 3'",
    ] {
        assert!(help.contains(want), "{want:?} in\n{help}");
    }
    // The short help keeps to the spec forms.
    let o = hotprobe(&["count", "-h"]);
    let short = text(&o.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(short.contains("usdt:[MODULE:]PROVIDER:NAME"), "{short}");
}
