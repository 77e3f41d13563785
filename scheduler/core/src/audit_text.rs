//! Audit rows for people: short lists, plain numbers and names, never a `Debug` dump.

use std::collections::BTreeMap;
use std::fmt::Display;

/// At most this many items of a list are written out; the rest are counted.
const LIST_CAP: usize = 20;

/// `5, 6, 7` or `5, 6, …, 24 and 12 more`: a list capped at [`LIST_CAP`] items.
pub fn capped_list<T: Display>(items: &[T]) -> String {
    let mut text = items
        .iter()
        .take(LIST_CAP)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > LIST_CAP {
        text.push_str(&format!(" and {} more", items.len() - LIST_CAP));
    }
    text
}

/// The trigger row: the run and the names of its params (values can be large or secret).
pub fn trigger(run: impl Display, params: &BTreeMap<String, String>) -> String {
    if params.is_empty() {
        return format!("run {run}, no params");
    }
    let names: Vec<&str> = params.keys().map(String::as_str).collect();
    format!("run {run}, params {}", capped_list(&names))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::InstanceId;

    #[test]
    fn lists_are_plain_and_capped() {
        let ids: Vec<InstanceId> = (5..8).map(InstanceId).collect();
        assert_eq!(capped_list(&ids), "5, 6, 7");
        let many: Vec<InstanceId> = (1..=32).map(InstanceId).collect();
        let text = capped_list(&many);
        assert!(text.starts_with("1, 2, 3"), "{text}");
        assert!(text.ends_with("19, 20 and 12 more"), "{text}");
        assert!(!text.contains("InstanceId"), "{text}");
    }

    #[test]
    fn a_trigger_row_names_params_without_their_values() {
        let params = BTreeMap::from([
            ("customer".to_string(), "acme".to_string()),
            ("blob".to_string(), "x".repeat(256 * 1024)),
        ]);
        assert_eq!(trigger(7, &params), "run 7, params blob, customer");
        assert_eq!(trigger(8, &BTreeMap::new()), "run 8, no params");
    }
}
