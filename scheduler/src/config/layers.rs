//! The layers of settings: each source's values as text, and a layer as a figment provider
//! that holds only the settings its source sets. Also where a merged value came from, for the
//! errors that name it.

use std::time::Duration;

use ax_core::placement::Strategy;
use ax_core::spec::Retention;
use clap::CommandFactory;
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};

use super::file::SettingsFile;
use super::{Cli, Settings};
use crate::auth::AuthMode;

/// A setting's value as flags, environment variables and the file write it.
pub(super) trait Text: Sized {
    fn read(text: &str) -> Result<Self, String>;
    fn write(&self) -> String;
}

impl Text for Duration {
    fn read(text: &str) -> Result<Self, String> {
        ax_core::duration::parse(text).map_err(|err| err.to_string())
    }
    fn write(&self) -> String {
        ax_core::duration::format(*self)
    }
}

impl Text for Strategy {
    fn read(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|err: ax_core::placement::UnknownStrategy| err.to_string())
    }
    fn write(&self) -> String {
        self.as_str().to_string()
    }
}

impl Text for AuthMode {
    fn read(text: &str) -> Result<Self, String> {
        text.parse()
    }
    fn write(&self) -> String {
        match self {
            AuthMode::Tokens => "tokens",
            AuthMode::Off => "none",
        }
        .to_string()
    }
}

/// `90d`, `12h`, … or `forever`, as a workflow's `retention`.
impl Text for Retention {
    fn read(text: &str) -> Result<Self, String> {
        ax_core::spec::parse_retention(text)
    }
    fn write(&self) -> String {
        match self {
            Retention::Forever => "forever".to_string(),
            Retention::Keep { ms } => format!("{ms}ms"),
        }
    }
}

/// The value parser of a [`Text`] setting's flag.
pub(super) fn read<T: Text>(text: &str) -> Result<T, String> {
    T::read(text)
}

/// Marks the messages of ax's own checks of a file's values, which name their key.
pub(super) const OWN_CHECK: &str = "\u{1}";

/// A [`Text`] setting in the file and between the layers.
pub(super) mod as_text {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    use super::{OWN_CHECK, Text};

    pub fn serialize<T: Text, S: Serializer>(
        value: &Option<T>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => serializer.serialize_some(&value.write()),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, T: Text, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<T>, D::Error> {
        let text = String::deserialize(deserializer)?;
        T::read(&text)
            .map(Some)
            .map_err(|message| D::Error::custom(format!("{OWN_CHECK}{message}")))
    }
}

/// Pool limits: `NAME=N` flags, a `[pools]` table in the file, a table between the layers (so
/// that they merge pool by pool).
pub(super) mod pool_table {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(
        pools: &[(String, u32)],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let table: BTreeMap<&str, u32> = pools
            .iter()
            .map(|(name, limit)| (name.as_str(), *limit))
            .collect();
        table.serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<(String, u32)>, D::Error> {
        Ok(BTreeMap::<String, u32>::deserialize(deserializer)?
            .into_iter()
            .collect())
    }
}

/// Where a layer comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    File,
    Environment,
    Flags,
}

impl Source {
    const ALL: [Source; 3] = [Source::File, Source::Environment, Source::Flags];

    fn name(self) -> &'static str {
        match self {
            Source::File => "config file",
            Source::Environment => "environment",
            Source::Flags => "flags",
        }
    }
}

/// One layer as a figment provider: the settings it sets, none of those it leaves unset.
pub(super) struct Layer<'a> {
    pub source: Source,
    pub settings: &'a Settings,
}

impl Provider for Layer<'_> {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.source.name())
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let unset = Value::serialize(Settings::default())?.into_dict();
        let set = Value::serialize(self.settings)?.into_dict();
        let (Some(unset), Some(mut set)) = (unset, set) else {
            return Err(figment::Error::from(
                "settings serialize as a table".to_string(),
            ));
        };
        set.retain(|key, value| unset.get(key) != Some(value));
        Ok(Profile::Default.collect(set))
    }
}

/// A bad value clap took from an environment variable names the variable, not the flag the
/// user did not give.
pub(super) fn name_the_variable(err: clap::Error, argv: &[std::ffi::OsString]) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if err.kind() != ErrorKind::ValueValidation {
        return err;
    }
    let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg) else {
        return err;
    };
    let flag = arg.split_whitespace().next().unwrap_or_default();
    let given = argv.iter().filter_map(|arg| arg.to_str()).any(|arg| {
        arg.strip_prefix(flag)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('='))
    });
    let mut command = Cli::command();
    let variable = command
        .get_arguments()
        .find(|arg| {
            arg.get_long()
                .is_some_and(|long| flag == format!("--{long}"))
        })
        .and_then(|arg| arg.get_env())
        .map(|variable| variable.to_string_lossy().into_owned());
    match (variable, std::error::Error::source(&err)) {
        (Some(variable), Some(why)) if !given && std::env::var_os(&variable).is_some() => {
            command.error(ErrorKind::ValueValidation, format!("{variable}: {why}"))
        }
        _ => err,
    }
}

/// Where the value of `key` came from, as a user finds it: `--node-lease`, `AX_NODE_LEASE`, or
/// `config file PATH: line L, column C`.
pub(super) fn origin(layers: &Figment, file: &SettingsFile, key: &str) -> String {
    let source = layers
        .find_metadata(key)
        .and_then(|metadata| Source::ALL.into_iter().find(|s| s.name() == metadata.name));
    let command = Cli::command();
    let arg = command.get_arguments().find(|arg| arg.get_id() == key);
    match (source, arg) {
        (Some(Source::Flags), Some(arg)) => format!("--{}", arg.get_long().unwrap_or(key)),
        (Some(Source::Environment), Some(arg)) => arg
            .get_env()
            .map_or_else(|| key.to_string(), |env| env.to_string_lossy().into_owned()),
        (Some(Source::File), _) => match file.position(key) {
            Some(at) => format!("config file {}: {at}", file.path.display()),
            None => format!("config file {}", file.path.display()),
        },
        _ => key.to_string(),
    }
}
