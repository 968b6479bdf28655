//! Runs an analysis or an exporter on a trace directory, straight through
//! the library (the CLI has the same as `hotprobe replay`, `hotprobe report
//! [--phases]` and `hotprobe export --format chrome|ctf|folded`).
//!
//! ```sh
//! cargo run --example analyse -- DIR replay|report|phases|chrome|folded|ctf OUTDIR
//! ```

use hotprobe_trace::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(dir), Some(what)) = (args.first(), args.get(1)) else {
        return Err("usage: analyse DIR replay|report|phases|chrome|folded|ctf OUTDIR".into());
    };
    let r = TraceReader::open(dir)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match what.as_str() {
        "replay" => replay(&r, &mut out, None)?,
        "report" => print!("{}", report(&r, None)?.to_text()),
        "phases" => print!(
            "{}",
            report_phases(&r, &PhaseSpec::from_trace(&r), None)?.to_text()
        ),
        "chrome" => {
            export_chrome(&r, &mut out, None)?;
        }
        "folded" => {
            export_folded(&r, &mut out, FoldedOptions::default(), None)?;
        }
        "ctf" => {
            let o = args.get(2).ok_or("ctf needs OUTDIR")?;
            let s = export_ctf(&r, o, None)?;
            eprintln!(
                "{} events, {} packets, {} streams",
                s.events, s.packets, s.streams
            );
        }
        o => return Err(format!("unknown analysis {o}").into()),
    }
    Ok(())
}
