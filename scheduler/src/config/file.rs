//! The `--config` file: TOML read into the settings, with errors that give the line and column
//! and quote nothing of the file.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::Settings;
use super::layers::OWN_CHECK;

/// The `--config` file: its settings, and its text for the positions of its values.
#[derive(Debug, Default)]
pub(super) struct SettingsFile {
    pub path: PathBuf,
    text: String,
    pub settings: Settings,
}

impl SettingsFile {
    pub fn read(path: &Path) -> anyhow::Result<SettingsFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        let settings = toml::de::Deserializer::parse(&text)
            .map_err(|err| toml_error(&text, &err, None))
            .and_then(|document| {
                serde_path_to_error::deserialize(document)
                    .map_err(|err| toml_error(&text, err.inner(), Some(err.path())))
            })
            .map_err(|what| anyhow::anyhow!("config file {}: {what}", path.display()))?;
        Ok(SettingsFile {
            path: path.to_path_buf(),
            text,
            settings,
        })
    }

    /// Where the file sets `key`: `line L, column C`.
    pub fn position(&self, key: &str) -> Option<String> {
        let document = toml::de::DeTable::parse(&self.text).ok()?;
        let (_, value) = document
            .get_ref()
            .iter()
            .find(|(name, _)| name.get_ref().as_ref() == key)?;
        Some(position(&self.text, value.span().start))
    }
}

/// `line L, column C` of byte `at` of `text` (both from 1, the column in characters).
fn position(text: &str, at: usize) -> String {
    let at = at.min(text.len());
    let before = &text.as_bytes()[..at];
    let line = before.iter().filter(|&&byte| byte == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&byte| byte == b'\n')
        .map_or(0, |newline| newline + 1);
    // `at` may fall inside a character of a file that is not text; count what decodes.
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    format!("line {line}, column {column}")
}

/// What is wrong with a TOML document and where, without quoting it: `--config` may name the
/// wrong file (a key, a token), and the toml crate's own message prints the line it failed on.
/// A position reads `line L, column C`; the message is the parser's (what it expected, from
/// TOML's grammar or the file's keys) with anything it quotes from the document left out: an
/// unknown key or value is named by its position. The messages of ax's own checks of a value
/// name its key (`path`).
fn toml_error(
    text: &str,
    err: &toml::de::Error,
    path: Option<&serde_path_to_error::Path>,
) -> String {
    let what = match err.message().strip_prefix(OWN_CHECK) {
        Some(message) => match path {
            Some(path) => format!("{path}: {message}"),
            None => message.to_string(),
        },
        None => toml_message(err.message()),
    };
    match err.span() {
        Some(span) => format!("{}: {what}", position(text, span.start)),
        None => what,
    }
}

/// The parser's message without what serde and toml quote from the document: the key of
/// `unknown field`, the value of `unknown variant`, `invalid type` and `invalid value`, the key
/// of `duplicate key`. Its expectations (after ", expected ") come from TOML's grammar or the
/// schema and stay; so do TOML's syntax messages (its grammar's words) and the messages of ax's
/// own checks (which name a setting's key and value).
fn toml_message(message: &str) -> String {
    let message = message.trim();
    let (what, expected) = match message.find(", expected ") {
        Some(at) => message.split_at(at),
        None => (message, ""),
    };
    let what = if what.starts_with("unknown field") {
        "unknown key".to_string()
    } else if what.starts_with("unknown variant") {
        "unknown value".to_string()
    } else if what.starts_with("invalid type")
        || what.starts_with("invalid value")
        || what.starts_with("duplicate key")
    {
        without_quoted(what)
    } else {
        what.to_string()
    };
    format!("{what}{expected}")
}

/// `text` up to its first quoted part (`` `…` `` or `\"…\"`): `invalid type: string \"…\"` reads
/// `invalid type: string`.
fn without_quoted(text: &str) -> String {
    match text.find(['`', '"']) {
        Some(at) => text[..at].trim_end().trim_end_matches(':').to_string(),
        None => text.to_string(),
    }
}
