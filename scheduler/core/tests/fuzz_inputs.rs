//! Random and mangled input to the parsers users feed directly: workflow files and cron
//! expressions. Whatever arrives, the answer is a value or an error that names where, never a
//! panic.

use ax_core::cron::{CronSchedule, parse_timezone};
use ax_core::spec::parse_workflow;
use proptest::prelude::*;

const EXAMPLE: &str = include_str!("../../../examples/etl.yaml");

/// Parses and checks the error's shape: `file:line: field: message`, naming the file given.
fn check(source: &str) {
    match parse_workflow(source, "fuzz.yaml") {
        Ok(parsed) => {
            assert!(!parsed.spec.tasks.is_empty());
            assert!(
                parsed.spec.dag().is_ok(),
                "an accepted workflow has a valid DAG"
            );
        }
        Err(err) => {
            let text = err.to_string();
            assert!(text.starts_with("fuzz.yaml:"), "{text}");
            assert!(!err.message.is_empty(), "{text}");
        }
    }
}

/// YAML-shaped text: keys the parser knows, keys it does not, and values of every kind.
fn yamlish() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("name"),
        Just("app"),
        Just("owner"),
        Just("schedule"),
        Just("cron"),
        Just("timezone"),
        Just("tasks"),
        Just("command"),
        Just("argv"),
        Just("upstream"),
        Just("timeout"),
        Just("retries"),
        Just("retry_backoff"),
        Just("labels"),
        Just("env"),
        Just("priority"),
        Just("defaults"),
        Just("working_dir"),
        Just("colour"),
        Just("- name"),
    ];
    let value = prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("[a, b]".to_string()),
        Just("{}".to_string()),
        Just("\"* * * * *\"".to_string()),
        Just("-1".to_string()),
        Just("99999999999999999999".to_string()),
        Just("10m".to_string()),
        Just("~".to_string()),
        Just("&anchor x".to_string()),
        Just("*anchor".to_string()),
        Just("'unterminated".to_string()),
        Just("Asia/Shanghai".to_string()),
        Just("\t".to_string()),
        "[a-z0-9 _:./-]{0,12}",
    ];
    let line = (0usize..4, key, value)
        .prop_map(|(indent, key, value)| format!("{}{key}: {value}", "  ".repeat(indent)));
    prop::collection::vec(line, 0..24).prop_map(|lines| lines.join("\n"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn arbitrary_text_never_panics_the_workflow_parser(source in ".{0,400}") {
        check(&source);
    }

    #[test]
    fn yaml_shaped_text_never_panics_the_workflow_parser(source in yamlish()) {
        check(&source);
    }

    #[test]
    fn a_truncated_or_mangled_example_is_refused_cleanly(cut in 0usize..EXAMPLE.len(), byte in any::<u8>(), at in 0usize..EXAMPLE.len()) {
        let mut truncated = EXAMPLE.as_bytes()[..cut].to_vec();
        check(&String::from_utf8_lossy(&truncated));
        if at < truncated.len() {
            truncated[at] = byte;
            check(&String::from_utf8_lossy(&truncated));
        }
    }

    #[test]
    fn arbitrary_cron_expressions_and_zones_never_panic(expression in "[0-9*/,A-Za-z@ -]{0,40}", zone in "[A-Za-z/_+-]{0,20}") {
        if let (Ok(schedule), Ok(tz)) = (CronSchedule::parse(&expression), parse_timezone(&zone)) {
            let fires = schedule.next_n(1_700_000_000_000, tz, 3);
            prop_assert!(fires.windows(2).all(|pair| pair[0] < pair[1]), "fires go forward");
        }
    }
}

#[test]
fn the_example_parses() {
    let parsed = parse_workflow(EXAMPLE, "etl.yaml").expect("example");
    assert_eq!(parsed.spec.tasks.len(), 5);
}
