//! Errors as the user sees them: one line on stderr and an exit code scripts can rely on.
//! The table of codes is documented in `axctl --help` (see `LONG_ABOUT` in main.rs).

use std::fmt;

use tonic::{Code, Status};

/// The process exit codes. Distinct classes get distinct codes so a script can tell "the workflow
/// does not exist" from "the server is down" without parsing messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    Ok = 0,
    Other = 1,
    Usage = 2,
    NotFound = 3,
    InvalidArgument = 4,
    Unavailable = 5,
    Conflict = 6,
    /// No valid token, or one whose role or app does not allow the call.
    Denied = 7,
    /// Refused for load (a bound on waiting instances) past `--retry-for`.
    Overloaded = 8,
    RunFailed = 10,
    RunCancelled = 11,
    /// `axctl diff`: applying would change something.
    Changes = 12,
    Interrupted = 130,
}

/// An error that knows its exit code. Anything else that reaches `main` exits with [`Exit::Other`].
#[derive(Debug)]
pub struct CtlError {
    pub exit: Exit,
    pub message: String,
    /// Printed without the `error: ` prefix, because the message is already a complete
    /// `FILE:LINE: FIELD: message` diagnostic that editors and grep understand.
    pub verbatim: bool,
}

impl CtlError {
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        CtlError {
            exit,
            message: message.into(),
            verbatim: false,
        }
    }

    pub fn usage(message: impl Into<String>) -> Self {
        CtlError::new(Exit::Usage, message)
    }
}

impl fmt::Display for CtlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CtlError {}

/// Maps a gRPC status from the server at `server` to a one-line error with its exit code.
pub fn from_status(status: &Status, server: &str) -> CtlError {
    let message = one_line(status.message());
    let or = |fallback: &str| {
        if message.is_empty() {
            fallback.to_string()
        } else {
            message.clone()
        }
    };
    match status.code() {
        Code::NotFound => CtlError::new(Exit::NotFound, or("not found")),
        // A set of files is refused with a line per problem: the lines are kept.
        Code::InvalidArgument | Code::OutOfRange => CtlError {
            exit: Exit::InvalidArgument,
            message: if message.is_empty() {
                "invalid argument".into()
            } else {
                status
                    .message()
                    .lines()
                    .map(one_line)
                    .filter(|line| !line.is_empty())
                    .collect::<Vec<_>>()
                    .join("\n")
            },
            verbatim: !message.is_empty(),
        },
        Code::Unavailable => CtlError::new(
            Exit::Unavailable,
            format!(
                "the ax server at {server} is unavailable: {}",
                or("no details")
            ),
        ),
        Code::DeadlineExceeded => CtlError::new(
            Exit::Unavailable,
            format!(
                "the ax server at {server} did not answer in time: {}",
                or("deadline exceeded")
            ),
        ),
        Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => {
            CtlError::new(Exit::Conflict, or("failed precondition"))
        }
        Code::Unauthenticated => CtlError::new(
            Exit::Denied,
            format!("not authenticated: {}", or("no details")),
        ),
        Code::PermissionDenied => CtlError::new(
            Exit::Denied,
            format!("permission denied: {}", or("no details")),
        ),
        Code::ResourceExhausted if ax_proto::overloaded::of(status).is_some() => {
            CtlError::new(Exit::Overloaded, or("refused for load"))
        }
        code => CtlError::new(
            Exit::Other,
            format!("server error ({code:?}): {}", or("no details")),
        ),
    }
}

/// The connection to `server` could not be opened. The innermost cause ("Connection refused")
/// is the useful part; tonic's own top-level text is only "transport error".
pub fn unreachable(server: &str, err: &(dyn std::error::Error + 'static)) -> CtlError {
    let mut cause: &(dyn std::error::Error + 'static) = err;
    while let Some(source) = cause.source() {
        cause = source;
    }
    CtlError::new(
        Exit::Unavailable,
        format!(
            "cannot reach the ax server at {server}: {}",
            one_line(&cause.to_string())
        ),
    )
}

/// Prints `err` on stderr as one line and returns its exit code. A closed stdout (`axctl logs |
/// head`) is not an error worth a message: the reader got what it wanted.
pub fn report(err: &anyhow::Error) -> Exit {
    for cause in err.chain() {
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::BrokenPipe
        {
            return Exit::Ok;
        }
    }
    let ctl = err
        .chain()
        .find_map(|cause| cause.downcast_ref::<CtlError>());
    let exit = ctl.map_or(Exit::Other, |ctl| ctl.exit);
    match ctl {
        // Context added around a verbatim diagnostic would break its FILE:LINE shape.
        // The server's messages may quote what a caller sent: shown escaped, as stdout is.
        Some(ctl) if ctl.verbatim => {
            eprintln!("{}", crate::output::escape_keeping_lines(&ctl.message));
        }
        _ => eprintln!(
            "error: {}",
            crate::output::escape(&one_line(&format!("{err:#}")))
        ),
    }
    exit
}

/// Server messages may span lines; the contract here is one line per error.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_map_to_distinct_exit_codes() {
        let server = "http://127.0.0.1:7070";
        let cases = [
            (Code::NotFound, Exit::NotFound),
            (Code::InvalidArgument, Exit::InvalidArgument),
            (Code::Unavailable, Exit::Unavailable),
            (Code::FailedPrecondition, Exit::Conflict),
            (Code::AlreadyExists, Exit::Conflict),
            (Code::Unauthenticated, Exit::Denied),
            (Code::PermissionDenied, Exit::Denied),
            (Code::Internal, Exit::Other),
        ];
        for (code, exit) in cases {
            assert_eq!(
                from_status(&Status::new(code, "x"), server).exit,
                exit,
                "{code:?}"
            );
        }
    }

    #[test]
    fn invalid_argument_is_verbatim_and_unavailable_names_the_server() {
        let server = "http://10.0.0.1:7070";
        let err = from_status(
            &Status::invalid_argument("wf.yaml:3: tasks[0].cron: bad"),
            server,
        );
        assert!(err.verbatim);
        assert_eq!(err.message, "wf.yaml:3: tasks[0].cron: bad");
        let err = from_status(
            &Status::invalid_argument("a.yaml:3: x:  bad\n\nb.yaml:1: y: worse\n"),
            server,
        );
        assert_eq!(err.message, "a.yaml:3: x: bad\nb.yaml:1: y: worse");
        let err = from_status(&Status::unavailable("connection reset"), server);
        assert!(err.message.contains(server), "{}", err.message);
    }
}
