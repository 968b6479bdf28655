//! What a command line clap refused gets: one error line (with clap's
//! suggestion, or a hint for a program named without `--`) pointing at
//! the subcommand's --help, and exit 2.

use crate::cli::{self, Cli};
use crate::out::{self, errln};
use clap::CommandFactory;
use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

/// The subcommand the command line names, as a path: `["hotprobe",
/// "guest", "count"]` (just `["hotprobe"]` when it names none).
pub(crate) fn subcommand_path(args: &[OsString]) -> Vec<String> {
    let mut cmd = Cli::command();
    let mut path = vec![cmd.get_name().to_string()];
    for a in args.iter().skip(1) {
        let Some(a) = a.to_str() else { continue };
        if a == "--" {
            break;
        }
        if a.starts_with('-') {
            continue;
        }
        let Some(sub) = cmd.find_subcommand(a).cloned() else {
            continue;
        };
        path.push(sub.get_name().to_string());
        cmd = sub;
    }
    path
}

/// `file` exists, is a regular file and executable by someone.
fn executable(file: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    file.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `name` (no `/`) is an executable in `$PATH`.
fn in_path(name: &str) -> bool {
    if name.is_empty() || name.contains(['/', ':', '*', '?', '[', '%']) {
        return false;
    }
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p)
            .filter(|d| !d.as_os_str().is_empty())
            .any(|d| executable(&d.join(name)))
    })
}

/// `a`, quoted for a POSIX shell when it needs it.
fn shell_word(a: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./:=+,@%-".contains(c);
    if !a.is_empty() && a.chars().all(plain) {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

/// When a command line of count, trace, watch or record that clap refused gives
/// the program without `--` (`hotprobe count work ./prog`): what to say
/// instead. A program is a positional that names an executable file by a
/// path, else one (not a count/trace probe's first) that names an
/// executable in `$PATH`; the command starts there.
fn program_hint(args: &[OsString], path: &[String]) -> Option<String> {
    let [_, sub] = path else { return None };
    let first_spec = match sub.as_str() {
        "count" | "trace" | "watch" => 1,
        "record" => 0,
        _ => return None,
    };
    let top = Cli::command();
    let cmd = top.find_subcommand(sub)?;
    let args: Vec<&str> = args.iter().map(|a| a.to_str()).collect::<Option<_>>()?;
    let at = 1 + args[1..].iter().position(|a| a == sub)?;
    let rest = &args[at + 1..];
    if rest.contains(&"--") {
        return None;
    }
    let opts = || cmd.get_arguments().chain(top.get_arguments());
    let takes_value = |a: &clap::Arg| a.get_action().takes_values();
    let long_value = |l: &str| opts().any(|a| a.get_long() == Some(l) && takes_value(a));
    let short_value = |c: char| opts().any(|a| a.get_short() == Some(c) && takes_value(a));
    // The positionals (index in `rest`), skipping options' values.
    let mut positionals = Vec::new();
    let mut i = 0;
    while i < rest.len() {
        let a = rest[i];
        if let Some(long) = a.strip_prefix("--") {
            if !long.contains('=') && long_value(long) {
                i += 1;
            }
        } else if let Some(shorts) = a.strip_prefix('-').filter(|s| !s.is_empty()) {
            if let Some((k, c)) = shorts.char_indices().find(|(_, c)| short_value(*c)) {
                if k + c.len_utf8() == shorts.len() {
                    i += 1;
                }
            }
        } else {
            positionals.push(i);
        }
        i += 1;
    }
    let found = positionals
        .iter()
        .enumerate()
        .find(|(_, &i)| rest[i].contains('/') && executable(Path::new(rest[i])))
        .or_else(|| {
            positionals
                .iter()
                .enumerate()
                .find(|(j, &i)| *j >= first_spec && in_path(rest[i]))
        });
    let (nth, &i) = found?;
    let mut line: Vec<String> = args[..=at].iter().map(|a| shell_word(a)).collect();
    line[0] = "hotprobe".into();
    line.extend(rest[..i].iter().map(|a| shell_word(a)));
    if nth < first_spec {
        line.push("PROBE...".into());
    }
    line.push("--".into());
    line.extend(rest[i..].iter().map(|a| shell_word(a)));
    Some(format!(
        "`{}` looks like a program: put `--` before the command ({})",
        rest[i],
        line.join(" ")
    ))
}

/// What a command line clap refused gets: the help it asked for, or one
/// error line pointing at the subcommand's --help.
pub(crate) fn parse_error(e: clap::Error, args: &[OsString]) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let _ = e.print();
        return ExitCode::from(2);
    }
    // Colours are not decided yet: only by the environment.
    out::init_colors(cli::ColorWhen::Auto);
    let path = subcommand_path(args);
    if matches!(
        e.kind(),
        ErrorKind::MissingRequiredArgument | ErrorKind::UnknownArgument
    ) {
        if let Some(hint) = program_hint(args, &path) {
            errln!("{} {hint}", out::error_prefix());
            return ExitCode::from(2);
        }
    }
    // clap says `error: <what>`, maybe continued on indented
    // lines, then a usage block: keep what it says, on one line.
    let rendered = e.to_string();
    let what: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more"))
        .map(|l| l.trim().trim_start_matches("error: "))
        .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
        .collect();
    // clap's suggestion for a mistyped subcommand or flag, said plainly.
    use clap::error::{ContextKind, ContextValue};
    let suggested = [ContextKind::SuggestedSubcommand, ContextKind::SuggestedArg]
        .into_iter()
        .find_map(|k| match e.get(k) {
            Some(ContextValue::String(s)) => Some(s.clone()),
            Some(ContextValue::Strings(v)) if !v.is_empty() => Some(v.join("' or '")),
            _ => None,
        })
        .map_or(String::new(), |s| format!("; did you mean '{s}'?"));
    errln!(
        "{} {}{suggested} (see {} --help)",
        out::error_prefix(),
        what.join(" "),
        path.join(" ")
    );
    ExitCode::from(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subcommand_paths() {
        let p = |a: &[&str]| {
            let v: Vec<OsString> = a.iter().map(OsString::from).collect();
            subcommand_path(&v).join(" ")
        };
        assert_eq!(
            p(&["hotprobe", "count", "x", "--", "trace"]),
            "hotprobe count"
        );
        assert_eq!(
            p(&["hotprobe", "--color", "never", "list", "count"]),
            "hotprobe list"
        );
        assert_eq!(
            p(&["hotprobe", "guest", "--gdb", "x", "trace"]),
            "hotprobe guest trace"
        );
        assert_eq!(p(&["hotprobe", "nope"]), "hotprobe");
    }

    #[test]
    fn shell_words() {
        assert_eq!(shell_word("./prog"), "./prog");
        assert_eq!(shell_word("work*"), "'work*'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}
