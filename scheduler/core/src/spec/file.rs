//! The workflow file as written: serde types that mirror the YAML field for field, read by
//! `serde-saphyr` with the line of every value.
//!
//! The structs refuse unknown fields (`deny_unknown_fields`), so their field lists are the only
//! list of what a file may say. Everything below a field is kept as written ([`Value`],
//! [`Map`], [`List`], [`Choice`]) rather than typed by serde, because the user is owed
//! `file:line: field: why` for a wrong value: `validate.rs` turns what was written into the
//! model and words every refusal. What serde itself refuses (an unknown field, a duplicate
//! key, a key that is not a string, YAML that does not parse) is worded here, with the path
//! [`read`] tracks while it reads.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeSeed, IgnoredAny, IntoDeserializer, MapAccess, SeqAccess};
use serde_saphyr::Spanned;

/// Deeper YAML than this is refused: the format needs four levels, and a bound keeps a hostile
/// `[[[[…` file from costing memory or stack.
pub const MAX_DEPTH: usize = 32;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowFile {
    pub name: Option<Spanned<Value>>,
    pub app: Option<Spanned<Value>>,
    pub owner: Option<Spanned<Value>>,
    pub description: Option<Spanned<Value>>,
    pub schedule: Option<Spanned<Map<ScheduleFile>>>,
    pub concurrency: Option<Spanned<Map<ConcurrencyFile>>>,
    pub retention: Option<Spanned<Value>>,
    pub defaults: Option<Spanned<Map<DefaultsFile>>>,
    pub tasks: Option<Spanned<List<Spanned<Map<TaskFile>>>>>,
    pub on_failure: Option<Spanned<List<Spanned<Map<TaskFile>>>>>,
    pub on_success: Option<Spanned<List<Spanned<Map<TaskFile>>>>>,
    pub deadline: Option<Spanned<Value>>,
    pub on_deadline: Option<Spanned<Choice<crate::deadline::OnDeadline>>>,
    pub params: Option<Spanned<Map<ParamPairs>>>,
}

/// One declared param (`params.NAME`); null (`NAME:` alone) declares an optional param with
/// no default.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamFile {
    pub description: Option<Spanned<Value>>,
    pub default: Option<Spanned<Value>>,
    pub required: Option<Spanned<Value>>,
    pub choices: Option<Spanned<List<Spanned<Value>>>>,
}

/// The declarations of `params` in file order; the names, with their lines, are in the
/// enclosing [`Map`].
pub struct ParamPairs(pub Vec<Spanned<Map<ParamFile>>>);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleFile {
    pub cron: Option<Spanned<Value>>,
    pub timezone: Option<Spanned<Value>>,
    pub misfire: Option<Spanned<Choice<MisfireName>>>,
    pub max_catch_up: Option<Spanned<Value>>,
    pub overlap: Option<Spanned<Choice<crate::spec::OverlapPolicy>>>,
    pub max_active_runs: Option<Spanned<Value>>,
    pub start: Option<Spanned<Value>>,
    pub end: Option<Spanned<Value>>,
    pub after: Option<Spanned<List<Spanned<Value>>>>,
}

/// The names of `schedule.misfire`; `catch_up` takes its bound from `max_catch_up`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MisfireName {
    Skip,
    FireOnce,
    CatchUp,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencyFile {
    pub max_running_tasks: Option<Spanned<Value>>,
    pub key: Option<Spanned<Value>>,
    pub max_runs_per_key: Option<Spanned<Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultsFile {
    pub timeout: Option<Spanned<Value>>,
    pub retries: Option<Spanned<Value>>,
    pub retry_backoff: Option<Spanned<Value>>,
    pub labels: Option<Spanned<Map<Pairs>>>,
    pub env: Option<Spanned<Map<EnvPairs>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskFile {
    pub name: Option<Spanned<Value>>,
    pub command: Option<Spanned<Value>>,
    pub argv: Option<Spanned<List<Spanned<Value>>>>,
    pub timeout: Option<Spanned<Value>>,
    pub retries: Option<Spanned<Value>>,
    pub retry_backoff: Option<Spanned<Value>>,
    pub env: Option<Spanned<Map<EnvPairs>>>,
    pub working_dir: Option<Spanned<Value>>,
    pub labels: Option<Spanned<Map<Pairs>>>,
    pub priority: Option<Spanned<Value>>,
    pub upstream: Option<Spanned<List<Spanned<Value>>>>,
    pub concurrency: Option<Spanned<Value>>,
    pub pool: Option<Spanned<Value>>,
    pub routing: Option<Spanned<Choice<crate::spec::Routing>>>,
    pub self_fence: Option<Spanned<Value>>,
    pub survive_worker_restart: Option<Spanned<Value>>,
    pub trigger_rule: Option<Spanned<Choice<crate::trigger_rule::TriggerRule>>>,
    #[serde(rename = "if")]
    pub condition: Option<Spanned<Value>>,
    pub for_each: Option<Spanned<List<Spanned<Value>>>>,
    pub max_items: Option<Spanned<Value>>,
    pub run_workflow: Option<Spanned<Value>>,
    pub params: Option<Spanned<Map<Pairs>>>,
}

/// The values of a string map (`env`, `labels`) in file order; the keys, with their lines,
/// are in the enclosing [`Map`].
pub struct Pairs(pub Vec<Spanned<Value>>);

/// The values of an `env` map in file order: strings, or references to secrets.
pub struct EnvPairs(pub Vec<Spanned<EnvValue>>);

/// An `env` value: a string, or `{ secret: NAME }`, which the task gets as the secret's value.
#[derive(Debug, Clone, PartialEq)]
pub enum EnvValue {
    Value(Value),
    /// What stood after `secret:`.
    Secret(Spanned<Value>),
    /// A mapping other than `{ secret: NAME }`: its keys.
    OtherMapping(Vec<String>),
}

impl From<Value> for EnvValue {
    fn from(value: Value) -> Self {
        EnvValue::Value(value)
    }
}

/// A scalar as written, or the kind of collection that stood where a scalar belongs.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A quoted scalar, or a plain one YAML reads as a string.
    Text(String),
    /// A plain scalar YAML reads as a number or a boolean; its text is in the source, at the
    /// value's span (see [`raw_text`]).
    Typed,
    Null,
    List,
    Mapping,
}

/// A mapping as written: its fields, and its keys with their lines in file order.
pub enum Map<T> {
    Fields {
        fields: T,
        keys: Vec<Key>,
    },
    /// Something else stood where a mapping belongs.
    Other(Value),
}

/// A list as written. A scalar in its place is kept as [`List::Other`]: `upstream` and
/// `schedule.after` take one name as a list of one.
pub enum List<T> {
    Items(Vec<T>),
    Other(Value),
}

/// A name from a closed set (a policy, a routing strategy), or what was written instead.
pub enum Choice<E> {
    Known(E),
    /// A string that names none of them.
    Unknown(String),
    Other(Value),
}

/// The names serde knows for `C`, in declaration order.
pub fn names<'de, C: Deserialize<'de>>() -> &'static [&'static str] {
    let nothing: de::value::StrDeserializer<'_, NameError> = "\u{0}".into_deserializer();
    match C::deserialize(nothing) {
        Ok(_) => &[],
        Err(NameError { expected }) => expected,
    }
}

/// A mapping key and its 1-based line.
#[derive(Debug, Clone)]
pub struct Key {
    pub name: String,
    pub line: usize,
}

impl<T> Map<T> {
    /// The line of key `name`, when the mapping has it.
    pub fn key_line(&self, name: &str) -> Option<usize> {
        match self {
            Map::Fields { keys, .. } => keys.iter().find(|k| k.name == name).map(|k| k.line),
            Map::Other(_) => None,
        }
    }
}

/// A refusal met while reading: where, which field, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub line: usize,
    pub field: String,
    pub message: String,
}

/// The 1-based line a spanned value starts on.
pub fn line<T>(value: &Spanned<T>) -> usize {
    value.referenced.line() as usize
}

/// The source text of a spanned scalar: what the user typed, for a [`Value::Typed`] read where
/// text is expected (`name: 2024`, `PORT: 8080`).
pub fn raw_text<'s, T>(source: &'s str, value: &Spanned<T>) -> &'s str {
    let span = value.referenced.span();
    let (Some(offset), Some(len)) = (span.byte_offset(), span.byte_len()) else {
        return "";
    };
    usize::try_from(offset)
        .ok()
        .zip(usize::try_from(len).ok())
        .and_then(|(offset, len)| source.get(offset..offset.checked_add(len)?))
        .unwrap_or("")
}

/// Reads `source` into the file model. `Ok(None)` for a file without a document (empty, or
/// only comments).
pub fn read(source: &str) -> Result<Option<Spanned<Map<WorkflowFile>>>, Refusal> {
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: MAX_DEPTH,
            max_aliases: 0,
            max_documents: 1,
        },
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::PassThrough,
        merge_keys: serde_saphyr::MergeKeyPolicy::AsOrdinary,
        strict_booleans: true,
        non_finite_float_policy: serde_saphyr::NonFiniteFloatPolicy::PassThrough,
        with_snippet: false,
    };
    let _reading = Reading::start(source);
    let result =
        serde_saphyr::from_str_with_options::<Option<Spanned<Map<WorkflowFile>>>>(source, options);
    match result {
        Ok(file) => Ok(file),
        Err(error) => Err(Reading::take_refusal().unwrap_or_else(|| yaml_refusal(&error))),
    }
}

/// What serde-saphyr refused on its own: YAML that does not parse, or a limit of the format.
fn yaml_refusal(error: &serde_saphyr::Error) -> Refusal {
    use serde_saphyr::Error as E;
    use serde_saphyr::budget::BudgetBreach;
    let line = error.location().map_or(0, |l| l.line() as usize);
    let message = match error {
        E::Budget {
            breach: BudgetBreach::Depth { .. },
            ..
        } => format!("nesting deeper than {MAX_DEPTH} levels"),
        E::Budget {
            breach: BudgetBreach::Aliases { .. },
            ..
        } => "YAML aliases are not supported".to_string(),
        E::Budget {
            breach: BudgetBreach::Documents { .. },
            ..
        }
        | E::MultipleDocuments { .. } => {
            "a workflow file holds exactly one YAML document".to_string()
        }
        other => bare_message(other),
    };
    Refusal {
        line,
        field: "(yaml)".to_string(),
        message,
    }
}

/// The error's text without its location prefix (the refusal carries the line).
fn bare_message(error: &serde_saphyr::Error) -> String {
    let text = error.without_snippet().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    let text = match text.split_once(": ") {
        Some((prefix, rest)) if prefix.starts_with("line ") => rest,
        _ => text,
    };
    let text = text.lines().next().unwrap_or_default().trim();
    // Scanner messages end with their own position.
    match text.rsplit_once(" at line ") {
        Some((message, position)) if position.contains(", column ") => message.to_string(),
        _ => text.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// The reading context: the path to the value being read, and the first refusal. Serde gives a
// `Deserialize` impl no context of its own, so `read` keeps it per thread for its duration.

thread_local! {
    static READING: RefCell<Option<Reading>> = const { RefCell::new(None) };
}

struct Reading {
    source: String,
    path: Vec<Segment>,
    refusal: Option<Refusal>,
}

enum Segment {
    Key(String),
    Index(usize),
}

/// Ends the reading context when `read` returns, however it returns.
struct ReadingGuard;

impl Drop for ReadingGuard {
    fn drop(&mut self) {
        READING.with(|r| r.borrow_mut().take());
    }
}

impl Reading {
    fn start(source: &str) -> ReadingGuard {
        READING.with(|r| {
            *r.borrow_mut() = Some(Reading {
                source: source.to_string(),
                path: Vec::new(),
                refusal: None,
            })
        });
        ReadingGuard
    }

    fn with<R>(f: impl FnOnce(&mut Reading) -> R) -> Option<R> {
        READING.with(|r| r.borrow_mut().as_mut().map(f))
    }

    fn take_refusal() -> Option<Refusal> {
        Reading::with(|r| r.refusal.take()).flatten()
    }

    fn push(segment: Segment) {
        Reading::with(|r| r.path.push(segment));
    }

    fn pop() {
        Reading::with(|r| r.path.pop());
    }

    /// The field path being read: `tasks[0].env.A`; empty at the root.
    fn path() -> String {
        Reading::with(|r| {
            let mut out = String::new();
            for segment in &r.path {
                match segment {
                    Segment::Key(name) => {
                        if !out.is_empty() {
                            out.push('.');
                        }
                        out.push_str(name);
                    }
                    Segment::Index(i) => out.push_str(&format!("[{i}]")),
                }
            }
            out
        })
        .unwrap_or_default()
    }

    /// Records the first refusal and hands back the error that stops the deserializer.
    fn refuse<E: de::Error>(line: usize, field: String, message: String) -> E {
        Reading::with(|r| {
            r.refusal.get_or_insert(Refusal {
                line,
                field,
                message,
            });
        });
        E::custom("refused")
    }

    fn raw_text<T>(value: &Spanned<T>) -> String {
        Reading::with(|r| raw_text(&r.source, value).to_string()).unwrap_or_default()
    }
}

/// `(root)` for the file itself, else the path.
fn field_or_root(path: String) -> String {
    if path.is_empty() {
        "(root)".to_string()
    } else {
        path
    }
}

// ---------------------------------------------------------------------------------------------
// Deserialize impls: everything is read with `deserialize_any`, so a value of the wrong kind
// is kept, not refused, and `validate.rs` says what was expected.

/// What stood in a place, for the values that are not the collection a visitor wants.
struct ScalarVisitor;

macro_rules! typed_visits {
    ($($method:ident: $ty:ty),*) => {
        $(fn $method<E: de::Error>(self, _: $ty) -> Result<Self::Value, E> {
            Ok(Value::Typed.into())
        })*
    };
}

/// The scalar visits every kept value shares: a string as written, a null, or a typed plain
/// scalar whose text stays in the source.
macro_rules! scalar_visits {
    () => {
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Value::Text(v.to_string()).into())
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
            Ok(Value::Text(v).into())
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Value::Null.into())
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Value::Null.into())
        }
        typed_visits!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_i128: i128,
            visit_u128: u128, visit_f64: f64);
    };
}

impl<'de> de::Visitor<'de> for ScalarVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    scalar_visits!();

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::List)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        // A mapping where a scalar belongs is refused as a whole, whatever its keys.
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Value::Mapping)
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ScalarVisitor)
    }
}

struct EnvVisitor;

impl<'de> de::Visitor<'de> for EnvVisitor {
    type Value = EnvValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string or { secret: NAME }")
    }

    scalar_visits!();

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<EnvValue, A::Error> {
        ScalarVisitor.visit_seq(seq).map(EnvValue::Value)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EnvValue, A::Error> {
        let mut secret = None;
        let mut keys = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == "secret" {
                secret = Some(map.next_value::<Spanned<Value>>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
            keys.push(key);
        }
        match secret {
            Some(name) if keys.len() == 1 => Ok(EnvValue::Secret(name)),
            _ => Ok(EnvValue::OtherMapping(keys)),
        }
    }
}

impl<'de> Deserialize<'de> for EnvValue {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(EnvVisitor)
    }
}

impl<'de> Deserialize<'de> for EnvPairs {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EnvPairsVisitor;
        impl<'de> de::Visitor<'de> for EnvPairsVisitor {
            type Value = EnvPairs;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EnvPairs, A::Error> {
                let mut values = Vec::new();
                while map.next_key::<IgnoredAny>()?.is_some() {
                    values.push(map.next_value::<Spanned<EnvValue>>()?);
                }
                Ok(EnvPairs(values))
            }
        }
        deserializer.deserialize_map(EnvPairsVisitor)
    }
}

impl<T> From<Value> for Map<T> {
    fn from(value: Value) -> Self {
        Map::Other(value)
    }
}

impl<T> From<Value> for List<T> {
    fn from(value: Value) -> Self {
        List::Other(value)
    }
}

impl<E> From<Value> for Choice<E> {
    fn from(value: Value) -> Self {
        Choice::Other(value)
    }
}

impl<'de> Deserialize<'de> for Pairs {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PairsVisitor;
        impl<'de> de::Visitor<'de> for PairsVisitor {
            type Value = Pairs;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pairs, A::Error> {
                let mut values = Vec::new();
                while map.next_key::<IgnoredAny>()?.is_some() {
                    values.push(map.next_value::<Spanned<Value>>()?);
                }
                Ok(Pairs(values))
            }
        }
        deserializer.deserialize_map(PairsVisitor)
    }
}

impl<'de> Deserialize<'de> for ParamPairs {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ParamPairsVisitor;
        impl<'de> de::Visitor<'de> for ParamPairsVisitor {
            type Value = ParamPairs;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ParamPairs, A::Error> {
                let mut values = Vec::new();
                while map.next_key::<IgnoredAny>()?.is_some() {
                    values.push(map.next_value::<Spanned<Map<ParamFile>>>()?);
                }
                Ok(ParamPairs(values))
            }
        }
        deserializer.deserialize_map(ParamPairsVisitor)
    }
}

struct MapVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> de::Visitor<'de> for MapVisitor<T> {
    type Value = Map<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping")
    }

    scalar_visits!();

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Map<T>, A::Error> {
        ScalarVisitor.visit_seq(seq).map(Map::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Map<T>, A::Error> {
        let mut keyed = Keyed::new(map);
        let fields = T::deserialize(MapAccessDeserializer::new(&mut keyed))?;
        Ok(Map::Fields {
            fields,
            keys: keyed.keys,
        })
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Map<T> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MapVisitor(PhantomData))
    }
}

struct ListVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> de::Visitor<'de> for ListVisitor<T> {
    type Value = List<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }

    scalar_visits!();

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<List<T>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        loop {
            Reading::push(Segment::Index(items.len()));
            let item = seq.next_element::<T>()?;
            Reading::pop();
            match item {
                Some(item) => items.push(item),
                None => return Ok(List::Items(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<List<T>, A::Error> {
        ScalarVisitor.visit_map(map).map(List::Other)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for List<T> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ListVisitor(PhantomData))
    }
}

struct ChoiceVisitor<E>(PhantomData<E>);

impl<'de, C: Deserialize<'de>> de::Visitor<'de> for ChoiceVisitor<C> {
    type Value = Choice<C>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Choice<C>, E> {
        let name: de::value::StrDeserializer<'_, NameError> = v.into_deserializer();
        Ok(match C::deserialize(name) {
            Ok(known) => Choice::Known(known),
            Err(_) => Choice::Unknown(v.to_string()),
        })
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Choice<C>, E> {
        self.visit_str(&v)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Choice<C>, E> {
        Ok(Value::Null.into())
    }

    fn visit_none<E: de::Error>(self) -> Result<Choice<C>, E> {
        Ok(Value::Null.into())
    }

    typed_visits!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_i128: i128,
        visit_u128: u128, visit_f64: f64);

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Choice<C>, A::Error> {
        ScalarVisitor.visit_seq(seq).map(Choice::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Choice<C>, A::Error> {
        ScalarVisitor.visit_map(map).map(Choice::Other)
    }
}

impl<'de, C: Deserialize<'de>> Deserialize<'de> for Choice<C> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ChoiceVisitor(PhantomData))
    }
}

/// Why a name was not one of a closed set: the names serde knows for it.
#[derive(Debug)]
struct NameError {
    expected: &'static [&'static str],
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expected one of {}", self.expected.join(", "))
    }
}

impl std::error::Error for NameError {}

impl de::Error for NameError {
    fn custom<T: fmt::Display>(_: T) -> Self {
        NameError { expected: &[] }
    }

    fn unknown_variant(_: &str, expected: &'static [&'static str]) -> Self {
        NameError { expected }
    }

    fn unknown_field(_: &str, expected: &'static [&'static str]) -> Self {
        NameError { expected }
    }
}

/// A mapping's entries with every key checked before serde sees it: a string, not repeated,
/// named in the path, its line kept. Unknown fields are refused here too, at the key's line.
struct Keyed<A> {
    inner: A,
    keys: Vec<Key>,
}

impl<A> Keyed<A> {
    fn new(inner: A) -> Self {
        Keyed {
            inner,
            keys: Vec::new(),
        }
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Keyed<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let Some(key) = self.inner.next_key::<Spanned<Value>>()? else {
            return Ok(None);
        };
        let line = line(&key);
        let name = match &key.value {
            Value::Text(text) => text.clone(),
            Value::Typed => Reading::raw_text(&key),
            other => {
                return Err(Reading::refuse(
                    line,
                    field_or_root(Reading::path()),
                    format!(
                        "keys must be strings, found {}",
                        super::validate::kind_of(other, "")
                    ),
                ));
            }
        };
        Reading::push(Segment::Key(name.clone()));
        if let Some(first) = self.keys.iter().find(|k| k.name == name) {
            return Err(Reading::refuse(
                line,
                Reading::path(),
                format!("duplicate key \"{name}\" (first at line {})", first.line),
            ));
        }
        let field: de::value::StrDeserializer<'_, NameError> = name.as_str().into_deserializer();
        let value = seed.deserialize(field).map_err(|NameError { expected }| {
            Reading::refuse(
                line,
                Reading::path(),
                format!(
                    "unknown field \"{name}\"; allowed fields: {}",
                    expected.join(", ")
                ),
            )
        })?;
        self.keys.push(Key { name, line });
        Ok(Some(value))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        let value = self.inner.next_value_seed(seed)?;
        Reading::pop();
        Ok(value)
    }
}
