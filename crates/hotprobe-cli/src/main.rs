//! `hotprobe`: dynamic probes on running Linux processes, from the shell.
//!
//! ```text
//! hotprobe list   (BINARY | -p PID) [PATTERN] [--blacklist]
//! hotprobe count  PROBE... (-p PID | -- CMD ARGS) [--duration SECS] [--mechanism auto|patch|jump|trap]
//! hotprobe coldpatch IN -o OUT
//! hotprobe trace  PROBE... (-p PID | -- CMD ARGS) [--args N] [--maxactive N]
//! hotprobe demo
//! hotprobe record [-o DIR] [--force] [PATTERN]... [--exclude GLOB]... [--phase FUNC]... [--max-depth N]
//!                 [--min-duration DUR] [--sample N] [--args N] [--mechanism auto|patch|jump]
//!                 [--no-aggregate] [--duration SECS] (-p PID | -- CMD ARGS)
//! hotprobe replay [DIR]
//! hotprobe report [DIR] [--phases] [--marker FUNC]...
//! hotprobe export [DIR] --format chrome|ctf|folded [-o OUT]
//! hotprobe guest  --gdb HOST:PORT|unix:PATH --symbols FILE [--ram FILE] (count|trace) PROBE... [--duration SECS]
//! PROBE: [module:]function[+offset] | [module:]0xADDR | file.c:LINE, optionally %return
//! DIR: a trace directory, hotprobe.data by default
//! ```
//! Every error is one line on stderr, `hotprobe: error: <what and why>`,
//! with exit code 1 (2 for a usage error); the target is left as it was.

mod analyse;
mod cli;
mod coldpatch;
mod count;
mod demo;
mod guest;
mod list;
mod out;
mod record;
mod session;
mod signals;
mod trace;

use clap::Parser;
use cli::{Cli, Cmd, GuestCmd, MechanismArg, RecordMechanism};
use out::errln;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

impl From<MechanismArg> for hotprobe::MechanismChoice {
    fn from(m: MechanismArg) -> Self {
        match m {
            MechanismArg::Auto => Self::Auto,
            MechanismArg::Patch => Self::Patch,
            MechanismArg::Jump => Self::Jump,
            MechanismArg::Trap => Self::Trap,
        }
    }
}

impl From<RecordMechanism> for hotprobe::MechanismChoice {
    fn from(m: RecordMechanism) -> Self {
        match m {
            RecordMechanism::Auto => Self::Auto,
            RecordMechanism::Patch => Self::Patch,
            RecordMechanism::Jump => Self::Jump,
        }
    }
}

impl From<cli::ExportFormat> for analyse::ExportFormat {
    fn from(f: cli::ExportFormat) -> Self {
        match f {
            cli::ExportFormat::Chrome => Self::Chrome,
            cli::ExportFormat::Ctf => Self::Ctf,
            cli::ExportFormat::Folded => Self::Folded,
        }
    }
}

/// A command line that parsed but does not make sense (exit code 2).
#[derive(Debug)]
struct UsageError(String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (see hotprobe --help)", self.0)
    }
}

impl std::error::Error for UsageError {}

fn duration(secs: Option<f64>) -> anyhow::Result<Option<Duration>> {
    match secs {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => {
            Err(UsageError(format!("--duration {s}: give a positive number of seconds")).into())
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Cmd::List {
            args,
            pid,
            blacklist,
        } => {
            let (binary, pattern) = match (pid, args.as_slice()) {
                (Some(_), []) => (None, None),
                (Some(_), [p]) => (None, Some(p.as_str())),
                (None, [b]) => (Some(PathBuf::from(b)), None),
                (None, [b, p]) => (Some(PathBuf::from(b)), Some(p.as_str())),
                (Some(_), _) => {
                    return Err(
                        UsageError("with -p PID give at most a PATTERN, no BINARY".into()).into(),
                    )
                }
                (None, _) => return Err(UsageError("give a BINARY or -p PID".into()).into()),
            };
            let binary = binary.as_deref().map(list::check_binary).transpose()?;
            list::run(&list::ListOptions {
                binary: binary.as_deref(),
                pid,
                pattern,
                blacklist,
            })
            .map(|()| 0)
        }
        Cmd::Count {
            probes,
            pid,
            duration: secs,
            maxactive,
            mechanism,
            follow_forks,
            cmd,
        } => {
            let duration = duration(secs)?;
            signals::install()?;
            count::run(&count::CountOptions {
                follow_forks,
                probes: &probes,
                pid,
                cmd: &cmd,
                duration,
                maxactive: maxactive.max(1),
                mechanism: mechanism.into(),
            })
        }
        Cmd::Coldpatch { input, output } => coldpatch::run(&input, &output).map(|()| 0),
        Cmd::Trace {
            probes,
            pid,
            args,
            maxactive,
            duration: secs,
            summary,
            mechanism,
            follow_forks,
            cmd,
        } => {
            let duration = duration(secs)?;
            signals::install()?;
            trace::run(&trace::TraceOptions {
                follow_forks,
                probes: &probes,
                pid,
                cmd: &cmd,
                args,
                maxactive: maxactive.max(1),
                duration,
                summary,
                mechanism: mechanism.into(),
            })
        }
        Cmd::Record {
            output,
            force,
            mut patterns,
            filter,
            exclude,
            phase,
            max_depth,
            min_duration,
            sample,
            args,
            mechanism,
            follow_forks,
            no_aggregate,
            ring_events,
            max_threads,
            duration: secs,
            pid,
            cmd,
        } => {
            let duration = duration(secs)?;
            if !ring_events.is_power_of_two() || !(64..=1 << 26).contains(&ring_events) {
                return Err(UsageError(format!(
                    "--ring-events {ring_events}: give a power of two between 64 and 2^26"
                ))
                .into());
            }
            patterns.extend(filter);
            signals::install()?;
            record::run(&record::RecordOptions {
                follow_forks,
                out: &output,
                force,
                include: &patterns,
                exclude: &exclude,
                phases: &phase,
                max_depth,
                min_duration_ns: min_duration,
                sample,
                args,
                mechanism: mechanism.into(),
                aggregate: !no_aggregate,
                ring_events,
                max_threads,
                duration,
                pid,
                cmd: &cmd,
            })
        }
        Cmd::Replay { dir } => analyse::replay_cmd(&dir).map(|()| 0),
        Cmd::Report {
            dir,
            phases,
            marker,
        } => analyse::report_cmd(&dir, phases, &marker).map(|()| 0),
        Cmd::Export {
            dir,
            format,
            output,
            calls,
            per_thread,
        } => analyse::export_cmd(&analyse::ExportOptions {
            dir: &dir,
            format: format.into(),
            out: output.as_deref(),
            calls,
            per_thread,
        })
        .map(|()| 0),
        Cmd::Demo => {
            signals::install()?;
            demo::run()
        }
        Cmd::Guest {
            gdb,
            symbols,
            ram,
            action,
        } => {
            if symbols.len() != gdb.len() {
                return Err(UsageError(format!(
                    "give one --symbols per --gdb ({} --gdb, {} --symbols)",
                    gdb.len(),
                    symbols.len()
                ))
                .into());
            }
            if !ram.is_empty() && ram.len() != gdb.len() {
                return Err(UsageError(format!(
                    "give no --ram, or one per --gdb ({} --gdb, {} --ram)",
                    gdb.len(),
                    ram.len()
                ))
                .into());
            }
            for g in &gdb {
                guest::stub_addr(g).map_err(|e| UsageError(e.to_string()))?;
            }
            let guests = gdb
                .into_iter()
                .zip(symbols)
                .enumerate()
                .map(|(i, (gdb, symbols))| guest::GuestSpec {
                    gdb,
                    symbols,
                    ram: ram.get(i).cloned(),
                })
                .collect();
            let (probes, secs, action) = match action {
                GuestCmd::Count {
                    probes,
                    duration,
                    maxactive,
                } => (
                    probes,
                    duration,
                    guest::Action::Count {
                        maxactive: maxactive.max(1),
                    },
                ),
                GuestCmd::Trace {
                    probes,
                    args,
                    maxactive,
                    duration,
                    summary,
                } => (
                    probes,
                    duration,
                    guest::Action::Trace {
                        args,
                        maxactive: maxactive.max(1),
                        summary,
                    },
                ),
            };
            let duration = duration(secs)?;
            signals::install()?;
            guest::run(&guest::GuestOptions {
                guests,
                probes: &probes,
                duration,
                action,
            })
            .map(|()| 0)
        }
    }
}

/// The error and its causes, joined with `: `, leaving out a cause whose
/// text the message already holds (errors that print their source inline).
fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// One line, whatever the message holds.
fn one_line(s: &str) -> String {
    s.trim()
        .lines()
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("; ")
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(2);
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
            errln!("hotprobe: error: {} (see hotprobe --help)", what.join(" "));
            return ExitCode::from(2);
        }
    };
    let result = run(cli);
    // A reader that went away is no failure (see `out`).
    let quiet = matches!(&result, Err(e) if out::is_closed_stdout(e));
    let result = match (result, out::write_error()) {
        (Ok(_), Some(e)) => Err(anyhow::Error::new(e).context("cannot write the output")),
        (r, _) => r,
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(_) if quiet => ExitCode::SUCCESS,
        Err(e) => {
            errln!("hotprobe: error: {}", one_line(&message(&e)));
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_formats_are_the_analysers() {
        use clap::ValueEnum;
        let names = |v: Vec<Option<clap::builder::PossibleValue>>| -> Vec<String> {
            v.into_iter()
                .map(|p| p.unwrap().get_name().to_string())
                .collect()
        };
        assert_eq!(
            names(
                cli::ExportFormat::value_variants()
                    .iter()
                    .map(|v| v.to_possible_value())
                    .collect()
            ),
            names(
                analyse::ExportFormat::value_variants()
                    .iter()
                    .map(|v| v.to_possible_value())
                    .collect()
            )
        );
        for f in cli::ExportFormat::value_variants() {
            let a: analyse::ExportFormat = (*f).into();
            assert_eq!(
                a.to_possible_value().unwrap().get_name(),
                f.to_possible_value().unwrap().get_name()
            );
        }
    }
}
