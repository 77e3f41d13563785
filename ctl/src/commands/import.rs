//! `axctl import crontab FILE [-d DIR] [--app APP] [--prefix P] [--timezone ZONE] [--system]`:
//! one workflow file per crontab entry (`ax_core::crontab_import`), written for `axctl apply -f
//! DIR`. Offline: nothing is sent to a server.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Context;
use ax_core::crontab_import::{ImportOptions, import_crontab};

use crate::error::{CtlError, Exit};
use crate::output;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Debug, clap::Subcommand)]
pub enum What {
    /// Write one workflow file per crontab entry: its schedule, its zone (CRON_TZ= or TZ=),
    /// its command and the environment lines above it. What ax has no equivalent for
    /// (MAILTO, @reboot, ...) is printed as a warning; a line that does not parse stops the
    /// import before any file is written.
    Crontab(CrontabArgs),
}

#[derive(Debug, clap::Args)]
pub struct CrontabArgs {
    /// The crontab (`crontab -l > FILE`, /etc/cron.d/NAME with --system), or - for stdin.
    pub file: PathBuf,

    /// The folder to write the workflow files to (made if missing). (`-o` is axctl's output
    /// format.)
    #[arg(
        short = 'd',
        long = "output-dir",
        visible_alias = "dir",
        value_name = "DIR",
        default_value = "."
    )]
    pub dir: PathBuf,

    /// The app of every workflow.
    #[arg(long)]
    pub app: Option<String>,

    /// Put before every workflow name (names come from the commands): `web1-` gives
    /// web1-backup.
    #[arg(long, default_value = "")]
    pub prefix: String,

    /// The zone of the entries above any CRON_TZ= or TZ= line: the host's, which cron used
    /// (UTC when not given).
    #[arg(long, value_name = "ZONE")]
    pub timezone: Option<String>,

    /// A system crontab (/etc/crontab, /etc/cron.d): a user column follows the schedule.
    #[arg(long)]
    pub system: bool,

    /// Overwrite files that exist already.
    #[arg(long)]
    pub force: bool,
}

fn read_crontab(path: &Path) -> anyhow::Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the crontab from standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read crontab {}", path.display()))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let What::Crontab(args) = args.what;
    let text = read_crontab(&args.file)?;
    let options = ImportOptions {
        file: args.file.display().to_string(),
        app: args.app,
        prefix: args.prefix,
        timezone: args.timezone,
        system: args.system,
    };
    let imported = import_crontab(&text, &options).map_err(|errors| CtlError {
        exit: Exit::InvalidArgument,
        message: errors.join("\n"),
        verbatim: true,
    })?;
    for warning in &imported.warnings {
        eprintln!("warning: {}", output::escape(warning));
    }
    let targets: Vec<(PathBuf, &str)> = imported
        .workflows
        .iter()
        .map(|w| (args.dir.join(format!("{}.yaml", w.name)), w.yaml.as_str()))
        .collect();
    if !args.force {
        let existing: Vec<String> = targets
            .iter()
            .filter(|(path, _)| path.exists())
            .map(|(path, _)| path.display().to_string())
            .collect();
        if !existing.is_empty() {
            return Err(CtlError::new(
                Exit::Conflict,
                format!(
                    "nothing written: {} exist already (--force overwrites them)",
                    existing.join(", ")
                ),
            )
            .into());
        }
    }
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot make folder {}", args.dir.display()))?;
    let mut report = String::new();
    for ((path, yaml), workflow) in targets.iter().zip(&imported.workflows) {
        std::fs::write(path, yaml).with_context(|| format!("cannot write {}", path.display()))?;
        report.push_str(&format!(
            "wrote {} (line {})\n",
            path.display(),
            workflow.line
        ));
    }
    if imported.workflows.is_empty() {
        eprintln!("no crontab entries to import in {}", options.file);
    }
    output::write_stdout(&report)
}
