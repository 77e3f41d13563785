//! A task's outputs: the `key=value` lines (and `key<<DELIMITER` blocks, as GitHub Actions'
//! `$GITHUB_OUTPUT`) a task writes to the file named by `$AX_OUTPUT`, read by its worker when the
//! process exits, stored with the attempt, and handed to the tasks below it as
//! `${tasks.TASK.outputs.KEY}` and `AX_UPSTREAM_<TASK>_<KEY>`.
//!
//! ```text
//! rows=1250
//! report<<EOF
//! first line
//! second line
//! EOF
//! ```
//! A key is an environment-variable name (`[A-Za-z_][A-Za-z0-9_]*`), so every output can reach a
//! task's environment; a key written twice keeps its last value. Blank lines are ignored. The
//! file is refused whole, naming the line, when a line is neither form or a block is not closed,
//! and when it is larger than [`MAX_ATTEMPT_BYTES`]: a truncated value would be a wrong value.

use std::collections::BTreeMap;
use std::fmt;

/// The most bytes of `$AX_OUTPUT` one attempt may pass on.
pub const MAX_ATTEMPT_BYTES: usize = 64 * 1024;
/// The most bytes of outputs (keys and values) the attempts of one run may keep together.
pub const MAX_RUN_BYTES: u64 = 1024 * 1024;

/// Outputs by key.
pub type Outputs = BTreeMap<String, String>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputsError {
    #[error(
        "$AX_OUTPUT holds {size} bytes, more than the {MAX_ATTEMPT_BYTES} an attempt may pass on"
    )]
    TooLarge { size: usize },
    #[error("$AX_OUTPUT is not UTF-8 text")]
    NotText,
    #[error("$AX_OUTPUT line {line}: {problem}")]
    Line { line: usize, problem: String },
}

/// Reads the text of `$AX_OUTPUT`.
pub fn parse(bytes: &[u8]) -> Result<Outputs, OutputsError> {
    if bytes.len() > MAX_ATTEMPT_BYTES {
        return Err(OutputsError::TooLarge { size: bytes.len() });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| OutputsError::NotText)?;
    let mut outputs = Outputs::new();
    let mut lines = text.lines().enumerate().map(|(i, line)| (i + 1, line));
    while let Some((at, line)) = lines.next() {
        if line.trim().is_empty() {
            continue;
        }
        let refuse = |problem: String| OutputsError::Line { line: at, problem };
        let (key, value) = match (line.find('='), line.find("<<")) {
            (Some(eq), heredoc) if heredoc.is_none_or(|h| eq < h) => {
                (&line[..eq], line[eq + 1..].to_string())
            }
            (_, Some(h)) => {
                let delimiter = &line[h + 2..];
                if delimiter.trim().is_empty() {
                    return Err(refuse("a block needs a delimiter after <<".into()));
                }
                let mut value: Vec<&str> = Vec::new();
                let mut closed = false;
                for (_, line) in lines.by_ref() {
                    if line == delimiter {
                        closed = true;
                        break;
                    }
                    value.push(line);
                }
                if !closed {
                    return Err(refuse(format!(
                        "the block is not closed by a line {delimiter:?}"
                    )));
                }
                (&line[..h], value.join("\n"))
            }
            _ => {
                return Err(refuse("expected KEY=VALUE or KEY<<DELIMITER".to_string()));
            }
        };
        if !is_key(key) {
            return Err(refuse(format!(
                "{key:?} is not a valid output name ([A-Za-z_][A-Za-z0-9_]*)"
            )));
        }
        outputs.insert(key.to_string(), value);
    }
    Ok(outputs)
}

/// Checks outputs that come from a worker (a worker is not trusted to have parsed them):
/// valid keys and at most [`MAX_ATTEMPT_BYTES`] of keys and values.
pub fn check(outputs: &Outputs) -> Result<(), String> {
    if let Some(key) = outputs.keys().find(|key| !is_key(key)) {
        return Err(format!("{key:?} is not a valid output name"));
    }
    let size = size(outputs);
    if size > MAX_ATTEMPT_BYTES as u64 {
        return Err(format!(
            "{size} bytes of outputs, more than the {MAX_ATTEMPT_BYTES} an attempt may pass on"
        ));
    }
    Ok(())
}

/// The bytes outputs count against the run's limit: their keys and values.
pub fn size(outputs: &Outputs) -> u64 {
    outputs
        .iter()
        .map(|(key, value)| (key.len() + value.len()) as u64)
        .sum()
}

fn is_key(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The variable a downstream task gets an upstream's output in: `AX_UPSTREAM_<TASK>_<KEY>`, the
/// task's name upper-cased with every character outside `[A-Z0-9]` made `_` (`load-db` →
/// `LOAD_DB`), the key as written.
pub fn env_name(task: &str, key: &str) -> String {
    let task: String = task
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("AX_UPSTREAM_{task}_{key}")
}

/// A `${tasks.TASK.outputs.KEY}` in a task's command, argv or env.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct OutputRef {
    pub task: String,
    pub key: String,
}

impl fmt::Display for OutputRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${{tasks.{}.outputs.{}}}", self.task, self.key)
    }
}

const OPEN: &str = "${tasks.";

/// The output references in `text`, in order; a `${tasks.` that is not a well-formed reference
/// is an error naming it (`${tasks.load}` lacks `.outputs.KEY`).
pub fn references(text: &str) -> Result<Vec<OutputRef>, String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        let Some(end) = after.find('}') else {
            return Err(format!("{OPEN}… is not closed by }}"));
        };
        let inner = &after[..end];
        let parts: Vec<&str> = inner.split('.').collect();
        match parts.as_slice() {
            [task, "outputs", key] if !task.is_empty() && is_key(key) => found.push(OutputRef {
                task: task.to_string(),
                key: key.to_string(),
            }),
            _ => {
                return Err(format!(
                    "${{tasks.{inner}}} is not an output reference: write \
                     ${{tasks.TASK.outputs.KEY}}"
                ));
            }
        }
        rest = &after[end + 1..];
    }
    Ok(found)
}

/// `text` with every output reference replaced by its value; the first reference `lookup` has
/// no value for is the error.
pub fn substitute(
    text: &str,
    lookup: impl Fn(&OutputRef) -> Option<String>,
) -> Result<String, OutputRef> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        let Some(end) = after.find('}') else { break };
        let parts: Vec<&str> = after[..end].split('.').collect();
        out.push_str(&rest[..start]);
        if let [task, "outputs", key] = parts.as_slice() {
            let reference = OutputRef {
                task: task.to_string(),
                key: key.to_string(),
            };
            match lookup(&reference) {
                Some(value) => out.push_str(&value),
                None => return Err(reference),
            }
        } else {
            out.push_str(&rest[start..start + OPEN.len() + end + 1]);
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outputs(pairs: &[(&str, &str)]) -> Outputs {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn lines_and_blocks_are_read() {
        let text = "rows=1250\n\nreport<<EOF\nfirst\nsecond = 2\nEOF\nempty=\nrows=1251\nurl=a=b\n";
        assert_eq!(
            parse(text.as_bytes()),
            Ok(outputs(&[
                ("rows", "1251"),
                ("report", "first\nsecond = 2"),
                ("empty", ""),
                ("url", "a=b"),
            ]))
        );
        assert_eq!(parse(b""), Ok(Outputs::new()));
    }

    /// (file, the refusal).
    const REFUSALS: &[(&str, &str)] = &[
        (
            "rows 12\n",
            "$AX_OUTPUT line 1: expected KEY=VALUE or KEY<<DELIMITER",
        ),
        (
            "ok=1\n1rows=2\n",
            "$AX_OUTPUT line 2: \"1rows\" is not a valid output name ([A-Za-z_][A-Za-z0-9_]*)",
        ),
        (
            "a-b=2\n",
            "$AX_OUTPUT line 1: \"a-b\" is not a valid output name ([A-Za-z_][A-Za-z0-9_]*)",
        ),
        (
            "text<<END\nline\n",
            "$AX_OUTPUT line 1: the block is not closed by a line \"END\"",
        ),
        (
            "text<<\n",
            "$AX_OUTPUT line 1: a block needs a delimiter after <<",
        ),
    ];

    #[test]
    fn a_malformed_file_is_refused_naming_its_line() {
        for (text, want) in REFUSALS {
            let got = parse(text.as_bytes()).map_err(|e| e.to_string());
            assert_eq!(got, Err(want.to_string()), "{text:?}");
        }
        assert_eq!(parse(&[0xff, b'=']), Err(OutputsError::NotText));
    }

    #[test]
    fn more_than_the_limit_is_refused_never_truncated() {
        let at_limit = format!("k={}", "x".repeat(MAX_ATTEMPT_BYTES - 2));
        assert_eq!(
            parse(at_limit.as_bytes()).map(|o| o["k"].len()),
            Ok(MAX_ATTEMPT_BYTES - 2)
        );
        let over = format!("{at_limit}x");
        assert_eq!(
            parse(over.as_bytes()),
            Err(OutputsError::TooLarge {
                size: MAX_ATTEMPT_BYTES + 1
            })
        );
    }

    #[test]
    fn references_are_found_substituted_and_refused_when_malformed() {
        let text =
            "load --rows ${tasks.extract.outputs.rows} --to ${tasks.pick.outputs.table} $HOME ${X}";
        let refs = references(text).unwrap();
        assert_eq!(
            refs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "${tasks.extract.outputs.rows}",
                "${tasks.pick.outputs.table}"
            ]
        );
        let values = outputs(&[("rows", "12"), ("table", "t1")]);
        assert_eq!(
            substitute(text, |r| values.get(&r.key).cloned()),
            Ok("load --rows 12 --to t1 $HOME ${X}".to_string())
        );
        assert_eq!(
            substitute(text, |r| (r.key == "rows").then(|| "1".to_string())),
            Err(OutputRef {
                task: "pick".into(),
                key: "table".into()
            })
        );
        assert!(
            references("${tasks.load}")
                .unwrap_err()
                .contains("${tasks.TASK.outputs.KEY}")
        );
        assert!(references("${tasks.a.outputs.b").is_err());
        assert_eq!(references("no refs ${param}"), Ok(Vec::new()));
    }

    #[test]
    fn env_names_are_upper_case_and_safe() {
        assert_eq!(
            env_name("load-db.v2", "rows"),
            "AX_UPSTREAM_LOAD_DB_V2_rows"
        );
        assert_eq!(size(&outputs(&[("ab", "cde")])), 5);
    }
}
