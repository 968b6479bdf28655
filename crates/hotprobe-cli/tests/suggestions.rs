//! Issue 24: a mistyped subcommand or flag gets clap's suggestion on the
//! one error line, and exit 2.

mod common;
use common::{hotprobe, text};

#[test]
fn mistyped_subcommands_and_flags_get_a_suggestion() {
    for (args, line) in [
        (
            &["cuont", "x"][..],
            "hotprobe: error: unrecognized subcommand 'cuont'; did you mean 'count'? (see hotprobe --help)",
        ),
        (
            &["count", "--mechansim", "trap", "x"][..],
            "hotprobe: error: unexpected argument '--mechansim' found; did you mean '--mechanism'? (see hotprobe count --help)",
        ),
        (
            &["reprot", "t"][..],
            "hotprobe: error: unrecognized subcommand 'reprot'; did you mean 'export' or 'report'? (see hotprobe --help)",
        ),
    ] {
        let out = hotprobe(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert_eq!(text(&out.stderr), format!("{line}\n"), "{args:?}");
    }
}
