//! Apps as boundaries: which app's secrets a task gets and a caller manages, and what a token
//! scoped to an app is told about names it cannot see.
//!
//! A secret belongs to an app or is global (app `""`), and each app has its own namespace of
//! secret names. A task of a workflow of app X gets X's secret of a name, else the global one;
//! a workflow without an app gets global ones only. No rule here ever reaches another app's
//! secret, so a scoped caller can neither use one nor learn whether one of some name exists.

use crate::spec::is_valid_name;

/// The apps whose secret of a given name a task of a workflow of `app` gets, in the order they
/// are tried: its own, then the global ones (`""`). Never another app's.
pub fn secret_lookup(app: &str) -> impl Iterator<Item = &str> {
    std::iter::once(app)
        .filter(|app| !app.is_empty())
        .chain(std::iter::once(""))
}

/// Why a caller may not name an app for its secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretAppError {
    /// Not an app's name at all.
    #[error(
        "app {0:?}: expected 1 to 64 of a-z, 0-9, '_', '.', '-', starting with a letter or digit"
    )]
    Invalid(String),
    /// Another app than the one the caller's token is scoped to (whether it exists or not).
    #[error(
        "this token is scoped to app {scope:?}: it manages that app's secrets only, not app \
         {asked:?}'s (global secrets and other apps' need a token not scoped to an app)"
    )]
    OutOfScope { scope: String, asked: String },
}

/// The app whose secrets a set or delete manages: `requested` (`""` = the default) as the
/// caller may. An unscoped caller manages the global secrets by default and any app's when it
/// names one; a caller scoped to an app manages that app's only.
pub fn managed_secret_app(scope: Option<&str>, requested: &str) -> Result<String, SecretAppError> {
    let requested = requested.trim();
    if !requested.is_empty() && !is_valid_name(requested) {
        return Err(SecretAppError::Invalid(requested.to_string()));
    }
    match scope {
        None => Ok(requested.to_string()),
        Some(scope) if requested.is_empty() || requested == scope => Ok(scope.to_string()),
        Some(scope) => Err(SecretAppError::OutOfScope {
            scope: scope.to_string(),
            asked: requested.to_string(),
        }),
    }
}

/// Which secrets a listing shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretListing {
    /// Every app's and the global ones.
    Every,
    /// Those a workflow of this app may name: its own and the global ones.
    UsableBy(String),
}

impl SecretListing {
    /// Whether a secret of `app` is in the listing.
    pub fn shows(&self, app: &str) -> bool {
        match self {
            SecretListing::Every => true,
            SecretListing::UsableBy(usable) => app.is_empty() || app == usable,
        }
    }
}

/// What a listing with `requested` (`""` = the default) shows this caller: an unscoped caller
/// sees every secret, or those one app's workflows may name when it names the app; a caller
/// scoped to an app sees its app's and the global ones (which its workflows may name too).
pub fn secret_listing(
    scope: Option<&str>,
    requested: &str,
) -> Result<SecretListing, SecretAppError> {
    let requested = requested.trim();
    match (scope, requested) {
        (None, "") => Ok(SecretListing::Every),
        _ => managed_secret_app(scope, requested).map(SecretListing::UsableBy),
    }
}

/// `names` (a cycle of workflows, say) as a caller scoped to an app may read them: each name
/// it cannot see (`visible` says) becomes the same placeholder, so what a scoped caller is told
/// names none of another app's workflows.
pub fn hide_invisible(names: &[String], visible: impl Fn(&str) -> bool) -> Vec<String> {
    names
        .iter()
        .map(|name| {
            if visible(name) {
                name.clone()
            } else {
                HIDDEN.to_string()
            }
        })
        .collect()
}

/// What a name a scoped caller cannot see is shown as.
pub const HIDDEN: &str = "(a workflow outside this token's app)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_gets_its_apps_secret_then_the_global_one_and_never_another_apps() {
        assert_eq!(secret_lookup("sales").collect::<Vec<_>>(), ["sales", ""]);
        assert_eq!(secret_lookup("").collect::<Vec<_>>(), [""]);
    }

    #[test]
    fn an_unscoped_caller_manages_global_secrets_by_default_and_any_apps_by_name() {
        assert_eq!(managed_secret_app(None, "").unwrap(), "");
        assert_eq!(managed_secret_app(None, " finance ").unwrap(), "finance");
        let bad = managed_secret_app(None, "Finance!").unwrap_err();
        assert_eq!(bad, SecretAppError::Invalid("Finance!".into()));
        assert!(
            bad.to_string().contains("app \"Finance!\": expected"),
            "{bad}"
        );
    }

    #[test]
    fn a_scoped_caller_manages_its_own_apps_secrets_only() {
        assert_eq!(managed_secret_app(Some("sales"), "").unwrap(), "sales");
        assert_eq!(managed_secret_app(Some("sales"), "sales").unwrap(), "sales");
        let refused = managed_secret_app(Some("sales"), "finance")
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("scoped to app \"sales\"") && refused.contains("not app \"finance\""),
            "{refused}"
        );
        // Another app's name is refused alike whether that app exists or not: nothing here
        // reads the store.
        assert_eq!(
            managed_secret_app(Some("sales"), "no-such-app")
                .unwrap_err()
                .to_string()
                .replace("no-such-app", "X"),
            refused.replace("finance", "X")
        );
    }

    #[test]
    fn a_listing_shows_what_the_caller_may_name() {
        assert_eq!(secret_listing(None, "").unwrap(), SecretListing::Every);
        let sales = SecretListing::UsableBy("sales".into());
        assert_eq!(secret_listing(None, "sales").unwrap(), sales);
        assert_eq!(secret_listing(Some("sales"), "").unwrap(), sales);
        assert!(secret_listing(Some("sales"), "finance").is_err());
        assert!(sales.shows("") && sales.shows("sales") && !sales.shows("finance"));
        assert!(SecretListing::Every.shows("finance"));
    }

    #[test]
    fn names_a_scoped_caller_cannot_see_read_alike() {
        let path: Vec<String> = ["a", "finance-x", "secret-y", "a"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            hide_invisible(&path, |name| name == "a"),
            ["a", HIDDEN, HIDDEN, "a"]
        );
    }
}
