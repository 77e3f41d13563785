//! Run parameters: what a trigger may pass to a run. Every task of the run receives each one in
//! its environment as `AX_PARAM_<NAME>`, so a name must be a valid environment variable name and
//! the whole set must fit in a process environment (Linux refuses an `execve` whose arguments
//! and environment pass `ARG_MAX`, 2 MiB by default, and any one string over 128 KiB): past
//! these limits every task of the run would fail to start, so the trigger is refused instead.

use std::collections::BTreeMap;
use std::fmt;

use crate::spec::{ParamSpec, is_valid_env_name};

/// At most this many params per run.
pub const MAX_PARAMS: usize = 256;
/// The longest name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// The longest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 64 << 10;
/// All names and values together, in bytes: well inside the 2 MiB an `execve` allows, with
/// room left for the task's own environment and the worker's.
pub const MAX_TOTAL_BYTES: usize = 256 << 10;

/// Why a set of params is refused. Each names the param at fault, if one is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamError {
    TooMany { count: usize },
    InvalidName { name: String },
    NameTooLong { name: String, bytes: usize },
    ValueTooLarge { name: String, bytes: usize },
    NulInValue { name: String },
    TooLarge { bytes: usize },
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamError::TooMany { count } => {
                write!(f, "too many params: {count} (max {MAX_PARAMS})")
            }
            ParamError::InvalidName { name } => write!(
                f,
                "param {name:?}: a param name must be a valid environment variable name \
                 ([A-Za-z_][A-Za-z0-9_]*), because tasks receive it as AX_PARAM_<NAME>"
            ),
            ParamError::NameTooLong { name, bytes } => {
                let shown: String = name.chars().take(32).collect();
                write!(
                    f,
                    "param {shown:?}…: the name is {bytes} bytes (max {MAX_NAME_BYTES})"
                )
            }
            ParamError::ValueTooLarge { name, bytes } => write!(
                f,
                "param {name:?}: the value is {bytes} bytes (max {MAX_VALUE_BYTES})"
            ),
            ParamError::NulInValue { name } => {
                write!(f, "param {name:?}: the value contains a NUL byte")
            }
            ParamError::TooLarge { bytes } => write!(
                f,
                "params are {bytes} bytes in all (max {MAX_TOTAL_BYTES}): \
                 pass large inputs by reference (a path or a URL) instead"
            ),
        }
    }
}

impl std::error::Error for ParamError {}

/// Checks a trigger's params; the first problem in name order is reported.
pub fn check<'a>(
    params: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), ParamError> {
    let params: BTreeMap<&String, &String> = params.into_iter().collect();
    if params.len() > MAX_PARAMS {
        return Err(ParamError::TooMany {
            count: params.len(),
        });
    }
    let mut total = 0usize;
    for (name, value) in params {
        if name.len() > MAX_NAME_BYTES {
            return Err(ParamError::NameTooLong {
                name: name.clone(),
                bytes: name.len(),
            });
        }
        if !is_valid_env_name(name) {
            return Err(ParamError::InvalidName { name: name.clone() });
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(ParamError::ValueTooLarge {
                name: name.clone(),
                bytes: value.len(),
            });
        }
        if value.contains('\0') {
            return Err(ParamError::NulInValue { name: name.clone() });
        }
        total += name.len() + value.len();
    }
    if total > MAX_TOTAL_BYTES {
        return Err(ParamError::TooLarge { bytes: total });
    }
    Ok(())
}

/// Why a trigger's params do not meet what the workflow declares (`params:` in its file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeclaredError {
    /// A required param was not given.
    Missing { name: String },
    /// A required param was given empty.
    Empty { name: String },
    /// A param with choices was given another value.
    NotAChoice {
        name: String,
        value: String,
        choices: Vec<String>,
    },
}

impl fmt::Display for DeclaredError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeclaredError::Missing { name } => write!(
                f,
                "missing required param {name:?}: the workflow declares it required without a \
                 default, so a trigger must give it (--param {name}=VALUE)"
            ),
            DeclaredError::Empty { name } => {
                write!(f, "param {name:?} is required and must not be empty")
            }
            DeclaredError::NotAChoice {
                name,
                value,
                choices,
            } => write!(
                f,
                "param {name:?}: {value:?} is not one of its choices ({})",
                choices.join(", ")
            ),
        }
    }
}

impl std::error::Error for DeclaredError {}

/// The params of a run nobody gave any to (a cron fire, a dependency or a backfill slot): each
/// declared default.
pub fn defaults(declared: &[ParamSpec]) -> BTreeMap<String, String> {
    let mut params = BTreeMap::new();
    fill_defaults(declared, &mut params);
    params
}

/// Gives each declared param that `params` lacks its default, if it has one. A param that is
/// given keeps its value, even empty: an empty value is a value.
pub fn fill_defaults(declared: &[ParamSpec], params: &mut BTreeMap<String, String>) {
    for param in declared {
        if let Some(default) = &param.default
            && !params.contains_key(&param.name)
        {
            params.insert(param.name.clone(), default.clone());
        }
    }
}

/// A trigger's params as its run gets them: the declared defaults filled in, then every
/// declared rule checked (the first problem in declaration order is reported). Params the
/// workflow does not declare pass as they are: a workflow's declarations describe its params,
/// they do not close the set (files written before declarations existed keep working).
pub fn apply_declared(
    declared: &[ParamSpec],
    params: &mut BTreeMap<String, String>,
) -> Result<(), DeclaredError> {
    fill_defaults(declared, params);
    for param in declared {
        match params.get(&param.name) {
            None if param.required => {
                return Err(DeclaredError::Missing {
                    name: param.name.clone(),
                });
            }
            None => {}
            Some(value) if param.required && value.is_empty() => {
                return Err(DeclaredError::Empty {
                    name: param.name.clone(),
                });
            }
            Some(value) if !param.choices.is_empty() && !param.choices.contains(value) => {
                return Err(DeclaredError::NotAChoice {
                    name: param.name.clone(),
                    value: value.clone(),
                    choices: param.choices.clone(),
                });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared() -> Vec<ParamSpec> {
        vec![
            ParamSpec {
                name: "day".into(),
                default: Some("2026-01-01".into()),
                ..Default::default()
            },
            ParamSpec {
                name: "env".into(),
                required: true,
                choices: vec!["staging".into(), "prod".into()],
                ..Default::default()
            },
            ParamSpec {
                name: "note".into(),
                ..Default::default()
            },
        ]
    }

    #[test]
    fn defaults_fill_what_a_trigger_leaves_out() {
        let mut given = params(&[("env", "prod"), ("extra", "kept")]);
        assert_eq!(apply_declared(&declared(), &mut given), Ok(()));
        assert_eq!(
            given,
            params(&[("day", "2026-01-01"), ("env", "prod"), ("extra", "kept")])
        );
        let mut given = params(&[("env", "staging"), ("day", "")]);
        assert_eq!(apply_declared(&declared(), &mut given), Ok(()));
        assert_eq!(given["day"], "", "a value given empty stays empty");
        assert_eq!(defaults(&declared()), params(&[("day", "2026-01-01")]));
    }

    #[test]
    fn a_required_param_must_be_given_and_not_empty() {
        let err = apply_declared(&declared(), &mut params(&[])).unwrap_err();
        assert_eq!(err, DeclaredError::Missing { name: "env".into() });
        assert!(
            err.to_string().contains("missing required param \"env\""),
            "{err}"
        );
        assert_eq!(
            apply_declared(&declared(), &mut params(&[("env", "")])),
            Err(DeclaredError::Empty { name: "env".into() })
        );
    }

    #[test]
    fn a_param_with_choices_takes_only_those() {
        let err = apply_declared(&declared(), &mut params(&[("env", "qa")])).unwrap_err();
        assert!(
            err.to_string()
                .contains("\"qa\" is not one of its choices (staging, prod)"),
            "{err}"
        );
    }

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn checked(pairs: &[(&str, &str)]) -> Result<(), ParamError> {
        check(&params(pairs))
    }

    #[test]
    fn names_are_environment_variable_names() {
        assert_eq!(checked(&[]), Ok(()));
        assert_eq!(
            checked(&[("CITY", "Lyon"), ("_day_1", ""), ("x", "a=b c")]),
            Ok(())
        );
        for bad in ["1abc", "bad-name", "a b", "", "é", "A.B", "A=B"] {
            let err = checked(&[("OK", "1"), (bad, "x")]).unwrap_err();
            assert_eq!(err, ParamError::InvalidName { name: bad.into() });
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn the_first_bad_name_in_name_order_is_reported() {
        let err = checked(&[("z-z", "1"), ("a-a", "2")]).unwrap_err();
        assert_eq!(err, ParamError::InvalidName { name: "a-a".into() });
    }

    #[test]
    fn count_and_sizes_are_bounded() {
        let many: BTreeMap<String, String> = (0..=MAX_PARAMS)
            .map(|i| (format!("P{i}"), String::new()))
            .collect();
        assert_eq!(
            check(&many),
            Err(ParamError::TooMany {
                count: MAX_PARAMS + 1
            })
        );
        let at_limit: BTreeMap<String, String> = many.into_iter().take(MAX_PARAMS).collect();
        assert_eq!(check(&at_limit), Ok(()));

        let long_name = "N".repeat(MAX_NAME_BYTES + 1);
        assert!(matches!(
            checked(&[(&long_name, "x")]),
            Err(ParamError::NameTooLong { bytes, .. }) if bytes == MAX_NAME_BYTES + 1
        ));
        assert_eq!(checked(&[(&"N".repeat(MAX_NAME_BYTES), "x")]), Ok(()));

        let big = "v".repeat(MAX_VALUE_BYTES + 1);
        assert_eq!(
            checked(&[("BIG", &big)]),
            Err(ParamError::ValueTooLarge {
                name: "BIG".into(),
                bytes: MAX_VALUE_BYTES + 1
            })
        );
        assert_eq!(checked(&[("BIG", &big[1..])]), Ok(()));
        assert_eq!(
            checked(&[("NUL", "a\0b")]),
            Err(ParamError::NulInValue { name: "NUL".into() })
        );
    }

    #[test]
    fn the_whole_set_must_fit_in_an_environment() {
        let value = "v".repeat(MAX_VALUE_BYTES);
        let names = ["A", "B", "C", "D"];
        let four: Vec<(&str, &str)> = names.iter().map(|n| (*n, value.as_str())).collect();
        // Four values at the per-value limit and their names: just over the total.
        assert_eq!(
            checked(&four),
            Err(ParamError::TooLarge {
                bytes: 4 * (MAX_VALUE_BYTES + 1)
            })
        );
        assert!(checked(&four).unwrap_err().to_string().contains("in all"));
        assert_eq!(checked(&four[..3]), Ok(()));
    }
}
