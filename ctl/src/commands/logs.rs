//! `axctl logs INSTANCE [--attempt N] [-f] [--timestamps] [--streams]`
//!
//! On a terminal each line is prefixed with its stream (`out|`, `err|`).
//!
//! A line's text is the task's: on a terminal, or after a `--streams` or `--timestamps`
//! prefix, the characters a terminal acts on are shown escaped (`output::escape`), so a task
//! cannot set the window title, clear the screen, write the clipboard or print a line that
//! reads as `err|` on stdout; `--raw` writes the bytes as stored, and so does a plain
//! `axctl logs ID > file`.

use std::io::{IsTerminal, Write};

use ax_proto::v1::{GetLogsRequest, LogStream, StoredLogLine};

use crate::client::{Client, Ctx};
use crate::output::{self, Output};
use crate::view::LogLineView;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The instance id (see `axctl get run ID`).
    pub instance: i64,

    /// Which attempt; the instance's current one by default.
    #[arg(long)]
    pub attempt: Option<u32>,

    /// Keep streaming until the attempt ends.
    #[arg(short, long)]
    pub follow: bool,

    /// Prefix each line with the time it was produced.
    #[arg(long)]
    pub timestamps: bool,

    /// Prefix each line with its stream, `out|` or `err|` (on a terminal they are, unless
    /// `--raw`).
    #[arg(long)]
    pub streams: bool,
}

/// Whether lines are prefixed with their stream: when asked, and on a terminal unless `--raw`
/// (a person reading tells stderr from stdout; a file or a pipe gets the task's bytes).
fn marks_streams(asked: bool, terminal: bool, raw: bool) -> bool {
    asked || (terminal && !raw)
}

impl Format {
    /// Escapes line texts where the module says: on a terminal, or after a prefix, unless
    /// `--raw`.
    pub fn escaping(mut self, terminal: bool) -> Format {
        self.escape = !output::raw() && (terminal || self.timestamps || self.streams);
        self
    }
}

/// How lines are printed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Format {
    pub timestamps: bool,
    pub streams: bool,
    pub output: Option<Output>,
    /// Show the characters a terminal acts on escaped.
    pub escape: bool,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let terminal = std::io::stdout().is_terminal();
    let format = Format {
        timestamps: args.timestamps,
        streams: marks_streams(args.streams, terminal, output::raw()),
        output: Some(ctx.output),
        escape: false,
    }
    .escaping(terminal);
    let mut stdout = std::io::stdout().lock();
    copy_logs(
        ctx,
        &mut client,
        args.instance,
        args.attempt.unwrap_or(0),
        args.follow,
        format,
        &mut stdout,
    )
    .await?;
    Ok(())
}

/// Streams the lines of one attempt to `out`, in order, flushing after each chunk so a follower
/// sees lines as they arrive. Returns how many lines were written. Shared with `axctl dev --run`.
pub async fn copy_logs(
    ctx: &Ctx,
    client: &mut Client,
    instance_id: i64,
    attempt: u32,
    follow: bool,
    format: Format,
    out: &mut impl Write,
) -> anyhow::Result<u64> {
    let request = GetLogsRequest {
        instance_id,
        attempt,
        follow,
        after_seq: 0,
        ..Default::default()
    };
    let mut stream = client
        .get_logs(request)
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    let mut written = 0;
    while let Some(chunk) = stream
        .message()
        .await
        .map_err(|status| ctx.status(status))?
    {
        for line in &chunk.lines {
            write_line(out, chunk.attempt, line, format)?;
            written += 1;
        }
        out.flush()?;
    }
    Ok(written)
}

fn write_line(
    out: &mut impl Write,
    attempt: u32,
    line: &StoredLogLine,
    format: Format,
) -> anyhow::Result<()> {
    match format.output {
        Some(Output::Json) => {
            // One object per line (JSON Lines), so the output streams and `jq` reads it as is.
            let text = serde_json::to_string(&LogLineView::new(attempt, line))?;
            writeln!(out, "{}", document(&text, format))?;
        }
        Some(Output::Yaml) => {
            let text = output::to_yaml(&LogLineView::new(attempt, line))?;
            out.write_all(document(&text, format).as_bytes())?;
        }
        Some(Output::Table | Output::Ascii | Output::Dot | Output::Mermaid) | None => {
            if format.timestamps {
                write!(out, "{} ", output::time(line.at_ms))?;
            }
            if format.streams {
                let prefix = match line.stream() {
                    LogStream::Stderr => "err|",
                    LogStream::Stdout | LogStream::Unspecified => "out|",
                };
                write!(out, "{prefix}")?;
            }
            if format.escape {
                writeln!(out, "{}", output::escape(&line.text))?;
            } else {
                writeln!(out, "{}", line.text)?;
            }
        }
    }
    Ok(())
}

/// A JSON or YAML rendering of a line: its serializer escapes line breaks; what a terminal
/// still acts on (DEL, C1, bidirectional controls) is escaped too when `format` escapes.
fn document(text: &str, format: Format) -> std::borrow::Cow<'_, str> {
    if format.escape {
        output::escape_keeping_lines(text)
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_optional_and_in_order() {
        let line = StoredLogLine {
            seq: 1,
            stream: LogStream::Stderr as i32,
            text: "boom".into(),
            at_ms: 0,
        };
        let mut out = Vec::new();
        write_line(&mut out, 1, &line, Format::default()).unwrap();
        let streams = Format {
            streams: true,
            timestamps: true,
            output: None,
            escape: false,
        };
        write_line(&mut out, 1, &line, streams).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "boom\n- err|boom\n");
    }

    #[test]
    fn a_prefix_escapes_the_text_after_it_even_in_a_pipe() {
        let forged = StoredLogLine {
            seq: 1,
            stream: LogStream::Stdout as i32,
            text: "x\rerr|forged".into(),
            at_ms: 0,
        };
        let piped = Format::default().escaping(false);
        let prefixed = Format {
            streams: true,
            ..Format::default()
        }
        .escaping(false);
        let mut out = Vec::new();
        write_line(&mut out, 1, &forged, piped).unwrap();
        write_line(&mut out, 1, &forged, prefixed).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "x\rerr|forged\nout|x\\u000derr|forged\n"
        );
    }

    #[test]
    fn a_terminal_sees_each_lines_stream_and_a_file_the_bytes() {
        assert!(marks_streams(false, true, false));
        assert!(!marks_streams(false, false, false));
        assert!(!marks_streams(false, true, true));
        assert!(marks_streams(true, false, true));
    }
}
