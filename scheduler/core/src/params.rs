//! Run parameters: what a trigger may pass to a run. Every task of the run receives each one in
//! its environment as `AX_PARAM_<NAME>`, so a name must be a valid environment variable name and
//! the whole set must fit in a process environment (Linux refuses an `execve` whose arguments
//! and environment pass `ARG_MAX`, 2 MiB by default, and any one string over 128 KiB): past
//! these limits every task of the run would fail to start, so the trigger is refused instead.

use std::collections::BTreeMap;
use std::fmt;

use crate::spec::is_valid_env_name;

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

#[cfg(test)]
mod tests {
    use super::*;

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
