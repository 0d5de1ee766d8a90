//! The `triage` binary: parse the command line, run the command, turn a failure into its exit
//! code. The commands, each with its flags and its output, are in `cli/`; what they drive is in
//! the library crates (`triage-drivers` for evaluation, calibration, training and benchmarks).

mod cli;
mod heap;

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use cli::{Cli, Command};

fn main() -> ExitCode {
    // Before any thread or model allocates: a prefill's per-op buffers are then reused, not
    // unmapped and faulted in again (`heap`).
    heap::retain_freed_memory();
    let cli = Cli::parse();
    cli::init_logging(matches!(cli.command, Command::Serve(_)));
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(exit_code(&err))
        }
    }
}

/// The exit code of a failed command: the kind of the library error inside (2 for the
/// caller's mistakes, 3 for a missing corpus or model, 4 for a conflict, 5 for overload),
/// else 1.
fn exit_code(err: &anyhow::Error) -> u8 {
    err.chain()
        .find_map(|e| match e.downcast_ref::<triage_drivers::DriverError>() {
            Some(driver) => driver.kind(),
            None => triage::error_kind(e),
        })
        .map_or(1, triage::ErrorKind::exit_code)
}

fn run(cli: Cli) -> Result<()> {
    cli::check_q8_kernel_override()?;
    match cli.command {
        Command::Models { command } => cli::models::run(command),
        Command::Generate(args) => cli::generate::run(args),
        Command::Serve(args) => cli::serve::run(args),
        Command::Ingest(args) => cli::ingest::run(args),
        Command::Retrieve(args) => cli::retrieve::run(args),
        Command::Ask(args) => cli::ask::run(args),
        Command::Train { command } => cli::train::run(command),
        Command::Eval(args) => cli::eval::run(args),
        Command::Calibrate(args) => cli::calibrate::run(args),
        Command::Signals(args) => cli::signals::run(args),
        Command::Bench { command } => cli::bench::run(command),
    }
}
