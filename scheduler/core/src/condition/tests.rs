use std::collections::{BTreeMap, BTreeSet};

use super::*;

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// A task with direct upstream `load`, and `extract` above it (load's upstream).
fn checked(source: &str) -> Result<(), ConditionError> {
    let upstream = set(&["load"]);
    let outputs_of = set(&["load", "extract"]);
    check(
        source,
        &Scope {
            upstream: &upstream,
            outputs_of: &outputs_of,
        },
    )
}

/// Expressions accepted at apply.
const ACCEPTED: &[&str] = &[
    "true",
    "params.mode == 'full'",
    "has(params.mode) && params.mode != 'dry'",
    "int(tasks.extract.outputs.rows) > 0",
    "tasks.load.outputs.rows != '0'",
    "tasks.load.state == 'SUCCESS' || tasks.load.state == 'SKIPPED'",
    "has(tasks.load.outputs.rows)",
    "tasks.load.outputs['file-name'].endsWith('.csv')",
    "size(tasks.extract.outputs.rows) > 0 && tasks.extract.outputs.rows.startsWith('1')",
    "double(params.ratio) >= 0.5",
    "params.region in ['eu', 'us']",
    "[1, 2, 3].exists(x, x > 2)",
    "params.mode.matches('^full|partial$')",
    "'rows' in tasks.load.outputs",
    "params.mode == 'a' ? true : false",
    "!(params.mode == 'dry')",
];

#[test]
fn these_expressions_are_accepted() {
    for source in ACCEPTED {
        assert_eq!(checked(source), Ok(()), "{source}");
    }
}

/// Refused at apply: (expression, a part of the message, where the error points).
const REFUSED: &[(&str, &str, usize)] = &[
    ("params.mode ==", "syntax error", 14),
    (
        "tasks.load.outputs.rows > 0",
        "compares a string with an int",
        24,
    ),
    ("tasks.load.outputs.rows > 0", "convert with int(...)", 24),
    (
        "params.mode",
        "must be true or false, and this is a string",
        0,
    ),
    ("size(params.mode)", "this is an int", 0),
    ("1 + params.mode == 'x'", "mixes an int with a string", 2),
    ("taks.load.state == 'SUCCESS'", "unknown name \"taks\"", 0),
    (
        "tasks.report.state == 'SUCCESS'",
        "task report is not upstream",
        0,
    ),
    (
        "tasks.extract.state == 'SUCCESS'",
        "not a direct upstream",
        0,
    ),
    ("tasks.load.state == 'SUCESS'", "'SUCESS' is no state", 20),
    (
        "tasks.load.status == 'SUCCESS'",
        "a task has .state and .outputs",
        0,
    ),
    (
        "tasks.load.outputs.rows.n == '1'",
        "is a string: it has no field .n",
        0,
    ),
    ("params.mode.x == '1'", "params.mode is a string", 0),
    ("tasks == 1", "name a task", 0),
    ("upper(params.mode) == 'A'", "unknown function upper()", 0),
    (
        "params.mode == 'a' && 1",
        "&& needs true or false, and this is an int",
        22,
    ),
    ("params.mode in 'abc'", "needs a list or a map", 15),
    ("true == 'yes'", "compares a bool with a string", 5),
];

#[test]
fn these_expressions_are_refused_where_they_go_wrong() {
    let mut wrong = Vec::new();
    for (source, message, offset) in REFUSED {
        match checked(source) {
            Ok(()) => wrong.push(format!("{source}: accepted")),
            Err(err) if !err.message.contains(message) || err.offset != *offset => {
                wrong.push(format!(
                    "{source}: at {} {:?}, not at {offset} {message:?}",
                    err.offset, err.message
                ))
            }
            Err(_) => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_huge_expression_is_refused_before_it_is_parsed() {
    let source = format!("params.a == '{}'", "x".repeat(MAX_CONDITION_BYTES));
    let err = checked(&source).unwrap_err();
    assert!(err.message.contains("bytes (max"), "{}", err.message);
}

#[test]
fn every_function_the_checker_accepts_is_one_the_interpreter_knows() {
    // One call each, on values of the right type: an unknown function would be an error.
    let calls = [
        "size('ab') == 2",
        "int('3') == 3",
        "uint('3') == 3u",
        "double('1.5') == 1.5",
        "string(3) == '3'",
        "bytes('a') == b'a'",
        "bool('true')",
        "dyn(1) == 1",
        "'abc'.contains('b')",
        "'abc'.startsWith('a')",
        "'abc'.endsWith('c')",
        "'abc'.matches('^a')",
    ];
    assert_eq!(calls.len(), FUNCTIONS.len());
    for (name, _) in FUNCTIONS {
        assert!(
            calls.iter().any(|c| c.contains(&format!("{name}("))),
            "no call of {name}"
        );
    }
    for call in calls {
        assert_eq!(
            evaluate(call, &Facts::default()).map(|j| j.value),
            Ok(true),
            "{call}"
        );
    }
}

fn facts() -> Facts {
    Facts {
        params: BTreeMap::from([("mode".into(), "full".into())]),
        tasks: BTreeMap::from([
            (
                "load".into(),
                TaskFacts {
                    state: Some(InstanceState::Success),
                    outputs: BTreeMap::from([("rows".into(), "0".into())]),
                },
            ),
            (
                "extract".into(),
                TaskFacts {
                    state: None,
                    outputs: BTreeMap::from([("files".into(), "[\"a\",\"b\"]".into())]),
                },
            ),
        ]),
    }
}

/// (expression, its value, the names it read as `why` shows them).
type Case = (&'static str, bool, &'static [&'static str]);

const JUDGED: &[Case] = &[
    (
        "int(tasks.load.outputs.rows) > 0",
        false,
        &["tasks.load.outputs.rows = \"0\""],
    ),
    (
        "params.mode == 'full' && tasks.load.state == 'SUCCESS'",
        true,
        &["params.mode = \"full\"", "tasks.load.state = \"SUCCESS\""],
    ),
    ("has(params.region)", false, &["params.region = (none)"]),
    (
        "has(tasks.load.outputs.rows)",
        true,
        &["tasks.load.outputs.rows = \"0\""],
    ),
    ("true", true, &[]),
];

#[test]
fn a_condition_is_judged_with_the_values_it_read() {
    for (source, value, read) in JUDGED {
        let judged = evaluate(source, &facts()).unwrap_or_else(|e| panic!("{source}: {e}"));
        assert_eq!(judged.value, *value, "{source}");
        assert_eq!(judged.read, *read, "{source}");
    }
    let judged = evaluate("int(tasks.load.outputs.rows) > 0", &facts()).unwrap();
    assert_eq!(
        judged.skipped_because("int(tasks.load.outputs.rows) > 0"),
        "if: int(tasks.load.outputs.rows) > 0 is false (tasks.load.outputs.rows = \"0\")"
    );
}

#[test]
fn a_condition_that_cannot_be_judged_says_why() {
    let missing = evaluate("params.region == 'eu'", &facts()).unwrap_err();
    assert!(missing.contains("cannot be judged"), "{missing}");
    assert!(missing.contains("region"), "{missing}");
    assert!(missing.contains("params.region = (none)"), "{missing}");
    let bad_int = evaluate("int(params.mode) > 0", &facts()).unwrap_err();
    assert!(bad_int.contains("cannot be judged"), "{bad_int}");
}

#[test]
fn the_tasks_a_condition_reads_are_listed_once() {
    assert_eq!(
        tasks_read(
            "tasks.load.state == 'SUCCESS' && int(tasks.extract.outputs.n) > int(tasks.load.outputs.n)"
        ),
        vec!["extract".to_string(), "load".to_string()]
    );
    assert!(tasks_read("params.mode == 'x'").is_empty());
}
