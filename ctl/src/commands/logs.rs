//! `axctl logs INSTANCE [--attempt N] [-f] [--timestamps] [--streams]`

use std::io::Write;

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

    /// Prefix each line with its stream, `out|` or `err|`.
    #[arg(long)]
    pub streams: bool,
}

/// How lines are printed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Format {
    pub timestamps: bool,
    pub streams: bool,
    pub output: Option<Output>,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let format = Format {
        timestamps: args.timestamps,
        streams: args.streams,
        output: Some(ctx.output),
    };
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
            writeln!(out, "{text}")?;
        }
        Some(Output::Yaml) => {
            out.write_all(output::to_yaml(&LogLineView::new(attempt, line))?.as_bytes())?;
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
            writeln!(out, "{}", line.text)?;
        }
    }
    Ok(())
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
        };
        write_line(&mut out, 1, &line, streams).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "boom\n- err|boom\n");
    }
}
