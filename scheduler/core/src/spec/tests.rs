use std::collections::BTreeMap;
use std::num::NonZeroU64;

use super::model::*;
use super::*;

const FILE: &str = "wf.yaml";

/// The canonical example of the file format (the one in the module documentation, with a
/// valid DAG).
const EXAMPLE: &str = "
    name: daily-sales-etl          # required
    app: analytics
    owner: data-team@example.com
    description: Nightly sales rollup
    schedule:
      cron: \"30 2 * * *\"
      timezone: Asia/Shanghai
    defaults:
      timeout: 30m
      retries: 2
      retry_backoff: 10s
      labels: {pool: etl}
      env: {TZ: UTC}
    tasks:
      - name: extract_orders
        command: ./extract.sh orders
        timeout: 10m
        retries: 3
        retry_backoff: 30s
        env: {SOURCE: orders, TZ: Asia/Shanghai}
        working_dir: /tmp
        labels: {region: cn}
        priority: 10
      - name: extract_refunds
        argv: [./extract.sh, refunds]
      - name: load
        command: ./load.sh
        upstream: [extract_orders, extract_refunds]
      - name: report
        command: ./report.sh
        upstream: load
";

/// Drops the first line break and the common indentation, so test files can be indented
/// with the code; line 1 is the first line after the opening quote.
fn doc(text: &str) -> String {
    let text = text.strip_prefix('\n').unwrap_or(text);
    let indent = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    text.lines()
        .map(|l| l.get(indent..).unwrap_or("").trim_end())
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn parse(yaml: &str) -> Result<ParsedWorkflow, SpecError> {
    parse_workflow(&doc(yaml), FILE)
}

fn parse_ok(yaml: &str) -> ParsedWorkflow {
    match parse(yaml) {
        Ok(parsed) => parsed,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// Checks every row of `topic` in [`REFUSALS`], and that the topic has rows.
#[track_caller]
fn check_refusals(topic: &str) {
    let rows: Vec<_> = REFUSALS.iter().filter(|(t, _, _)| *t == topic).collect();
    assert!(!rows.is_empty(), "no refusals for topic {topic}");
    for (_, yaml, expected) in rows {
        let source = if yaml.starts_with('\n') {
            doc(yaml)
        } else {
            yaml.to_string()
        };
        match parse_workflow(&source, FILE) {
            Ok(parsed) => panic!("expected `{expected}`, but it parsed: {parsed:?}"),
            Err(e) => assert_eq!(e.to_string(), *expected, "for:\n{source}"),
        }
    }
}

/// Every refusal of the workflow format: (topic, file, error), the acceptance suite of the
/// reader. Each test below checks the rows of its topic. A file that starts with a line break
/// goes through [`doc`] (line 1 is the first line after the opening quote); any other is read
/// as it is.
const REFUSALS: &[(&str, &str, &str)] = &[
    (
        "sub_workflows",
        "
            name: daily
            tasks:
              - name: load
                command: ./load.sh
                run_workflow: load-region
        ",
        "wf.yaml:5: tasks[0].run_workflow: command and run_workflow exclude each other: a task \
         either runs a command or starts a run of another workflow; give one of them",
    ),
    (
        "sub_workflows",
        "
            name: daily
            tasks:
              - name: load
                argv: [./load.sh]
                run_workflow: load-region
        ",
        "wf.yaml:5: tasks[0].run_workflow: argv and run_workflow exclude each other: a task \
         either runs a command or starts a run of another workflow; give one of them",
    ),
    (
        "sub_workflows",
        "
            name: daily
            tasks:
              - name: load
                run_workflow: load-region
                for_each: [eu, us]
        ",
        "wf.yaml:5: tasks[0].for_each: for_each and run_workflow exclude each other: mapping a \
         sub-workflow over a list is not supported",
    ),
    (
        "sub_workflows",
        "
            name: daily
            tasks:
              - name: load
                command: x
                params: {region: eu}
        ",
        "wf.yaml:5: tasks[0].params: only meaningful with run_workflow",
    ),
    (
        "sub_workflows",
        "
            name: daily
            tasks:
              - name: load
                run_workflow: daily
        ",
        "wf.yaml:4: tasks[0].run_workflow: run_workflow: cycle across workflows: daily → daily \
         (workflow daily cannot run itself)",
    ),
    (
        "sub_workflows",
        "
            name: daily
            tasks:
              - name: load
                run_workflow: load-region
                params:
                  day: ${params.day}
                  region: ${params.re-gion}
        ",
        "wf.yaml:7: tasks[0].params.region: ${params.re-gion} is not a param reference: write \
         ${params.NAME}",
    ),
    (
        "sub_workflows",
        "
            name: daily
            tasks:
              - name: load
                run_workflow: load-region
                params:
                  1region: eu
        ",
        "wf.yaml:6: tasks[0].params.1region: invalid param name \"1region\": expected \
         [A-Za-z_][A-Za-z0-9_]*, as the child's tasks get it as AX_PARAM_<NAME>",
    ),
    (
        "sub_workflows",
        "
            name: daily
            tasks:
              - {name: list, command: x}
              - name: load
                run_workflow: load-region
                params:
                  day: ${tasks.list.outputs.day}
        ",
        "wf.yaml:7: tasks[1].params.day: ${tasks.list.outputs.day}: task list is not upstream \
         of load, so its outputs may not exist when load runs",
    ),
    (
        "sub_workflows",
        "
            name: daily
            tasks:
              - name: load
                run_workflow: load-region
                routing: sharded_broadcast
        ",
        "wf.yaml:5: tasks[0].routing: has no effect on a run_workflow task: it takes no worker \
         and no slot; set routing on the called workflow's tasks (or its concurrency:)",
    ),
    (
        "sub_workflows",
        "
            name: daily
            tasks:
              - name: load
                run_workflow: load-region
                env:
                  REGION: eu
        ",
        "wf.yaml:6: tasks[0].env: has no effect on a run_workflow task: it takes no worker \
         and no slot; set env on the called workflow's tasks (or its concurrency:)",
    ),
    (
        "sub_workflows",
        "
            name: daily
            tasks:
              - name: load
                run_workflow: load-region
                pool: loaders
        ",
        "wf.yaml:5: tasks[0].pool: has no effect on a run_workflow task: it takes no worker \
         and no slot; set pool on the called workflow's tasks (or its concurrency:)",
    ),
    (
        "conditions",
        "
            name: etl
            tasks:
              - {name: extract, command: x}
              - name: load
                upstream: extract
                command: y
                if: tasks.extract.outputs.rows > 0
        ",
        "wf.yaml:7:36: tasks[1].if: compares a string with an int; outputs and params are \
         strings: convert with int(...) or double(...)",
    ),
    (
        "conditions",
        "
            name: etl
            tasks:
              - {name: extract, command: x}
              - name: load
                upstream: extract
                command: y
                if: \"tasks.extract.state == 'SUCESS'\"
        ",
        "wf.yaml:7:33: tasks[1].if: 'SUCESS' is no state; an upstream ends SUCCESS, FAILED, \
         TIMEOUT, CANCELLED, SKIPPED, UPSTREAM_FAILED",
    ),
    (
        "conditions",
        "
            name: etl
            tasks:
              - {name: extract, command: x}
              - name: load
                command: y
                if: tasks.extract.state == 'SUCCESS'
        ",
        "wf.yaml:6:9: tasks[1].if: task extract is not upstream of this task, so it has not \
         ended when this one is judged",
    ),
    (
        "conditions",
        "
            name: etl
            tasks:
              - {name: extract, command: x}
              - name: load
                upstream: extract
                command: y
                if: >-
                  params.mode == 'full' &&
                  tasks.extract.outputs.rows
        ",
        "wf.yaml:8: tasks[1].if: at character 26 of the expression: && needs true or false, \
         and this is a string",
    ),
    (
        "conditions",
        "
            name: etl
            tasks:
              - {name: extract, command: x}
              - name: load
                upstream: extract
                command: y
                if: params.mode ==
        ",
        "wf.yaml:7:23: tasks[1].if: syntax error: the expression ends where a value is expected",
    ),
    (
        "conditions",
        "
            name: etl
            tasks:
              - {name: extract, command: x}
              - name: cleanup
                upstream: extract
                trigger_rule: always
                command: y
                if: tasks.extract.state == 'FAILED'
        ",
        "wf.yaml:8: tasks[1].if: trigger_rule always starts this task with the run, before its \
         upstreams end: its if: may read params only",
    ),
    (
        "conditions",
        "
            name: etl
            tasks:
              - {name: extract, command: x}
              - name: load
                upstream: extract
                command: y
                if: ''
        ",
        "wf.yaml:7: tasks[1].if: must not be empty",
    ),
    (
        "deadlines",
        "
            name: etl
            schedule: {cron: '0 7 * * *', timezone: Asia/Shanghai}
            deadline: 06:30
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: deadline: 06:30 is not after the logical time of every run: the slot at \
         2027-01-01 07:00:00 CST (schedule.cron \"0 7 * * *\") is at or after 06:30 on its own \
         date; a deadline on the next day is written \"+1d 06:30\"",
    ),
    (
        "deadlines",
        "
            name: etl
            schedule: {cron: '30 6 * * MON-FRI'}
            deadline: '06:30'
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: deadline: 06:30 is not after the logical time of every run: the slot at \
         2027-01-01 06:30:00 UTC (schedule.cron \"30 6 * * MON-FRI\") is at or after 06:30 on \
         its own date; a deadline on the next day is written \"+1d 06:30\"",
    ),
    (
        "deadlines",
        "
            name: etl
            deadline: 25:00
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: deadline: invalid deadline \"25:00\": 25:00 is not a time of day (00:00 to \
         23:59)",
    ),
    (
        "deadlines",
        "
            name: etl
            deadline: 90
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: deadline: \"90\" has no unit: give one, e.g. 90d, 12h, 30m, or a time of \
         day such as 06:30",
    ),
    (
        "deadlines",
        "
            name: etl
            deadline: 0m
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: deadline: must be more than zero",
    ),
    (
        "deadlines",
        "
            name: etl
            deadline: tomorrow
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: deadline: invalid deadline \"tomorrow\": expected a time of day (06:30), \
         days after the logical date and a time (+1d 06:30) or a duration from the run's start \
         (2h, 90m)",
    ),
    (
        "deadlines",
        "
            name: etl
            deadline: [06:30]
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: deadline: expected a time of day or a duration, found a list",
    ),
    (
        "deadlines",
        "
            name: etl
            deadline: 2h
            on_deadline: kill
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: on_deadline: unknown deadline action \"kill\": expected alert or cancel",
    ),
    (
        "deadlines",
        "
            name: etl
            on_deadline: cancel
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: on_deadline: only meaningful with deadline",
    ),
    (
        "outputs",
        "
            name: etl
            tasks:
              - {name: extract, command: x}
              - {name: side, command: y}
              - name: load
                upstream: extract
                command: load --rows ${tasks.side.outputs.rows}
        ",
        "wf.yaml:7: tasks[2].command: ${tasks.side.outputs.rows}: task side is not upstream of \
         load, so its outputs may not exist when load runs",
    ),
    (
        "outputs",
        "
            name: etl
            tasks:
              - {name: extract, command: x}
              - name: load
                upstream: extract
                env: {ROWS: '${tasks.extrct.outputs.rows}'}
                command: load
        ",
        "wf.yaml:6: tasks[1].env.ROWS: ${tasks.extrct.outputs.rows}: unknown task \"extrct\"",
    ),
    (
        "outputs",
        "
            name: etl
            tasks:
              - {name: extract, command: x}
              - name: load
                upstream: extract
                argv: [load, '${tasks.extract.rows}']
        ",
        "wf.yaml:6: tasks[1].argv[1]: ${tasks.extract.rows} is not an output reference: write \
         ${tasks.TASK.outputs.KEY}",
    ),
    (
        "trigger_rules",
        "
            name: etl
            tasks:
              - {name: a, command: x}
              - name: b
                command: y
                upstream: a
                trigger_rule: one_succes
        ",
        "wf.yaml:7: tasks[1].trigger_rule: unknown trigger rule \"one_succes\": expected \
         all_success, all_done, one_failed, one_success, none_failed or always",
    ),
    (
        "trigger_rules",
        "
            name: etl
            tasks:
              - {name: a, command: x}
            on_failure:
              - {name: page, command: y, upstream: a}
        ",
        "wf.yaml:5: on_failure[0].upstream[0]: task \"a\" is in tasks, not in on_failure: \
         upstreams are tasks of the same list",
    ),
    (
        "trigger_rules",
        "
            name: etl
            tasks:
              - {name: a, command: x, upstream: [clean]}
            on_success:
              - {name: clean, command: y}
        ",
        "wf.yaml:3: tasks[0].upstream[0]: task \"clean\" is in on_success, not in tasks: \
         upstreams are tasks of the same list",
    ),
    (
        "trigger_rules",
        "
            name: etl
            tasks:
              - {name: a, command: x}
            on_failure:
              - {name: a, command: y}
        ",
        "wf.yaml:5: on_failure[0].name: duplicate task name \"a\" (first defined at line 3)",
    ),
    (
        "trigger_rules",
        "
            name: etl
            tasks:
              - {name: a, command: x}
            on_failure: page
        ",
        "wf.yaml:4: on_failure: expected a list of tasks, found a string",
    ),
    (
        "retention",
        "
            name: etl
            retention: 90
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: retention: \"90\" has no unit: give one, e.g. 90d, 12h, 30m (or forever to \
         keep every run)",
    ),
    (
        "retention",
        "
            name: etl
            retention: 0d
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: retention: must be more than zero (forever keeps every run)",
    ),
    (
        "retention",
        "
            name: etl
            retention: three months
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: retention: invalid duration \"three months\": expected a form like 500ms, \
         1.5s, 10m, 2h, 1h30m, 90d or a number of seconds (or forever to keep every run)",
    ),
    (
        "retention",
        "
            name: etl
            retention: [90d]
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: retention: expected a duration or forever, found a list",
    ),
    (
        "retention",
        "
            name: etl
            retention: 99999999999999d
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: retention: duration \"99999999999999d\" is too large",
    ),
    (
        "wrong_types",
        "
            name: etl
            tasks:
              - name: a
                command: x
                self_fence: no
        ",
        "wf.yaml:5: tasks[0].self_fence: expected true or false, found a string",
    ),
    (
        "unknown_fields_name_the_allowed_ones",
        "
            name: etl
            <<: {app: x}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: <<: unknown field \"<<\"; allowed fields: name, app, owner, description, \
         schedule, concurrency, retention, defaults, tasks, on_failure, on_success, deadline, \
         on_deadline, params",
    ),
    (
        "duplicate_keys",
        "
            name: etl
            tasks:
              - name: a
                command: x
                labels: {zone: a, zone: b}
        ",
        "wf.yaml:5: tasks[0].labels.zone: duplicate key \"zone\" (first at line 5)",
    ),
    (
        "a_dependency_trigger_names_its_upstream_workflows",
        "
            name: report
            schedule:
              cron: '0 2 * * *'
              after: [ingest]
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:4: schedule.after: cron and after exclude each other: a workflow is \
         started by its clock or by its upstream workflows",
    ),
    (
        "a_dependency_trigger_names_its_upstream_workflows",
        "
            name: report
            schedule: {after: [ingest, ingest]}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: schedule.after[1]: workflow ingest is listed twice",
    ),
    (
        "a_dependency_trigger_names_its_upstream_workflows",
        "
            name: report
            schedule:
              after: [report]
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: schedule.after: workflow report cannot depend on itself",
    ),
    (
        "a_dependency_trigger_names_its_upstream_workflows",
        "
            name: report
            schedule:
              after: [Bad Name]
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: schedule.after[0]: invalid name \"Bad Name\": expected 1 to 64 of \
         a-z, 0-9, '_', '.', '-', starting with a letter or digit",
    ),
    (
        "bad_durations_and_numbers",
        "
            name: etl
            tasks:
              - name: a
                command: x
                timeout: 1.5 hours
        ",
        "wf.yaml:5: tasks[0].timeout: invalid duration \"1.5 hours\": expected a form like \
         500ms, 1.5s, 10m, 2h, 1h30m, 90d or a number of seconds",
    ),
    (
        "bad_durations_and_numbers",
        "
            name: etl
            defaults:
              retry_backoff: 30m1h
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: defaults.retry_backoff: invalid duration \"30m1h\": expected a form \
         like 500ms, 1.5s, 10m, 2h, 1h30m, 90d or a number of seconds",
    ),
    (
        "bad_durations_and_numbers",
        "
            name: etl
            tasks:
              - name: a
                command: x
                timeout: -5
        ",
        "wf.yaml:5: tasks[0].timeout: invalid duration \"-5\": expected a form like \
         500ms, 1.5s, 10m, 2h, 1h30m, 90d or a number of seconds",
    ),
    (
        "bad_durations_and_numbers",
        "
            name: etl
            tasks:
              - name: a
                command: x
                timeout: 99999999999999999999h
        ",
        "wf.yaml:5: tasks[0].timeout: duration \"99999999999999999999h\" is too large",
    ),
    (
        "bad_durations_and_numbers",
        "
            name: etl
            tasks:
              - name: a
                command: x
                retries: -1
        ",
        "wf.yaml:5: tasks[0].retries: must be between 0 and 4294967295, found -1",
    ),
    (
        "bad_durations_and_numbers",
        "
            name: etl
            defaults:
              retries: 4294967296
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: defaults.retries: must be between 0 and 4294967295, found 4294967296",
    ),
    (
        "bad_durations_and_numbers",
        "
            name: etl
            tasks:
              - name: a
                command: x
                priority: 2147483648
        ",
        "wf.yaml:5: tasks[0].priority: must be between -2147483648 and 2147483647, found \
         2147483648",
    ),
    (
        "bad_durations_and_numbers",
        "
            name: etl
            tasks:
              - name: a
                command: x
                retries: 99999999999999999999999
        ",
        "wf.yaml:5: tasks[0].retries: must be between 0 and 4294967295, found \
         99999999999999999999999",
    ),
    (
        "bad_names",
        "
            name: Daily ETL
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:1: name: invalid name \"Daily ETL\": expected 1 to 64 of a-z, 0-9, '_', \
         '.', '-', starting with a letter or digit",
    ),
    (
        "bad_names",
        "
            name: etl
            app: My App
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: app: invalid name \"My App\": expected 1 to 64 of a-z, 0-9, '_', '.', \
         '-', starting with a letter or digit",
    ),
    (
        "bad_names",
        "
            name: etl
            tasks:
              - name: a
                command: x
              - name: bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
                command: x
        ",
        "wf.yaml:5: tasks[1].name: invalid name \
         \"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\": expected \
         1 to 64 of a-z, 0-9, '_', '.', '-', starting with a letter or digit",
    ),
    (
        "bad_names",
        "
            name: etl
            tasks:
              - name: -a
                command: x
        ",
        "wf.yaml:3: tasks[0].name: invalid name \"-a\": expected 1 to 64 of a-z, 0-9, \
         '_', '.', '-', starting with a letter or digit",
    ),
    (
        "command_and_argv",
        "
            name: etl
            tasks:
              - name: a
                command: x
                argv: [x]
        ",
        "wf.yaml:5: tasks[0].argv: command and argv exclude each other; give one of them",
    ),
    (
        "command_and_argv",
        "
            name: etl
            tasks:
              - name: a
                priority: 1
        ",
        "wf.yaml:3: tasks[0]: one of command, argv or run_workflow is required",
    ),
    (
        "command_and_argv",
        "
            name: etl
            tasks:
              - name: a
                command: '  '
        ",
        "wf.yaml:4: tasks[0].command: must not be empty",
    ),
    (
        "command_and_argv",
        "
            name: etl
            tasks:
              - name: a
                argv: []
        ",
        "wf.yaml:4: tasks[0].argv: must not be empty",
    ),
    (
        "command_and_argv",
        "
            name: etl
            tasks:
              - name: a
                command: x
                working_dir: ''
        ",
        "wf.yaml:5: tasks[0].working_dir: must not be empty",
    ),
    (
        "duplicate_keys",
        "
            name: etl
            name: other
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: name: duplicate key \"name\" (first at line 1)",
    ),
    (
        "duplicate_keys",
        "
            name: etl
            tasks:
              - name: a
                command: x
                env:
                  A: 1
                  A: 2
        ",
        "wf.yaml:7: tasks[0].env.A: duplicate key \"A\" (first at line 6)",
    ),
    (
        "duplicate_keys",
        "
            name: etl
            tasks:
              - name: a
                command: x
                command: y
        ",
        "wf.yaml:5: tasks[0].command: duplicate key \"command\" (first at line 4)",
    ),
    (
        "env_and_labels",
        "
            name: etl
            tasks:
              - name: a
                command: x
                env:
                  GOOD: 1
                  1BAD: 2
        ",
        "wf.yaml:7: tasks[0].env.1BAD: invalid environment variable name \"1BAD\": \
         expected [A-Za-z_][A-Za-z0-9_]*",
    ),
    (
        "env_and_labels",
        "
            name: etl
            tasks:
              - name: a
                command: x
                env:
                  DB_PASSWORD: {secret: warehouse-db, version: 2}
        ",
        "wf.yaml:6: tasks[0].env.DB_PASSWORD: expected a string or { secret: NAME }, found a \
         mapping with keys secret, version",
    ),
    (
        "env_and_labels",
        "
            name: etl
            tasks:
              - name: a
                command: x
                env:
                  DB_PASSWORD: {secret: \"has space\"}
        ",
        "wf.yaml:6: tasks[0].env.DB_PASSWORD.secret: invalid name \"has space\": expected 1 to \
         64 of a-z, 0-9, '_', '.', '-', starting with a letter or digit",
    ),
    (
        "env_and_labels",
        "
            name: etl
            defaults:
              env: {A-B: x}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: defaults.env.A-B: invalid environment variable name \"A-B\": expected \
         [A-Za-z_][A-Za-z0-9_]*",
    ),
    (
        "env_and_labels",
        "
            name: etl
            tasks:
              - name: a
                command: x
                labels: {'': x}
        ",
        "wf.yaml:5: tasks[0].labels.: label names must not be empty",
    ),
    (
        "graph_errors_point_at_the_line",
        "
            name: etl
            tasks:
              - name: a
                command: x
              - name: b
                command: x
              - name: a
                command: y
        ",
        "wf.yaml:7: tasks[2].name: duplicate task name \"a\" (first defined at line 3)",
    ),
    (
        "graph_errors_point_at_the_line",
        "
            name: etl
            tasks:
              - name: a
                command: x
              - name: b
                command: x
                upstream:
                  - a
                  - nope
        ",
        "wf.yaml:9: tasks[1].upstream[1]: unknown task \"nope\"",
    ),
    (
        "graph_errors_point_at_the_line",
        "
            name: etl
            tasks:
              - name: a
                command: x
                upstream: ghost
        ",
        "wf.yaml:5: tasks[0].upstream[0]: unknown task \"ghost\"",
    ),
    (
        "graph_errors_point_at_the_line",
        "
            name: etl
            tasks:
              - name: a
                command: x
                upstream: [a]
        ",
        "wf.yaml:5: tasks[0].upstream[0]: cycle: a → a (task \"a\" cannot depend on \
         itself)",
    ),
    (
        "graph_errors_point_at_the_line",
        "
            name: etl
            tasks:
              - {name: a, command: x}
              - {name: b, command: x, upstream: [a, a]}
        ",
        "wf.yaml:4: tasks[1].upstream[1]: upstream \"a\" is listed twice (first as \
         upstream[0])",
    ),
    (
        "graph_errors_point_at_the_line",
        "
            name: etl
            tasks:
              - name: a
                command: x
                upstream: [c]
              - name: b
                command: x
                upstream: [a]
              - name: c
                command: x
                upstream: [b]
        ",
        "wf.yaml:3: tasks[0]: cycle: a → b → c → a",
    ),
    (
        "graph_errors_point_at_the_line",
        "
            name: etl
            tasks:
              - {name: start, command: x}
              - {name: x, command: x, upstream: [start, z]}
              - {name: y, command: x, upstream: x}
              - {name: z, command: x, upstream: y}
        ",
        "wf.yaml:4: tasks[1]: cycle: x → y → z → x",
    ),
    (
        "missing_required_fields",
        "
            app: analytics
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:1: name: missing required field",
    ),
    (
        "missing_required_fields",
        "name: etl\n",
        "wf.yaml:1: tasks: missing required field",
    ),
    (
        "missing_required_fields",
        "
            name: etl
            tasks:
        ",
        "wf.yaml:2: tasks: missing required field",
    ),
    (
        "missing_required_fields",
        "
            name: etl
            tasks: []
        ",
        "wf.yaml:2: tasks: at least one task is required",
    ),
    (
        "missing_required_fields",
        "
            name: etl
            tasks:
              - command: x
                priority: 1
        ",
        "wf.yaml:3: tasks[0].name: missing required field",
    ),
    (
        "missing_required_fields",
        "\n",
        "wf.yaml:0: (root): the file holds no workflow",
    ),
    (
        "missing_required_fields",
        "# only a comment\n",
        "wf.yaml:0: (root): the file holds no workflow",
    ),
    (
        "policy_errors",
        "
            name: etl
            schedule: {cron: '0 2 * * *', misfire: later}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: schedule.misfire: unknown misfire policy \"later\": expected skip, \
         fire_once or catch_up",
    ),
    (
        "policy_errors",
        "
            name: etl
            schedule: {cron: '0 2 * * *', max_catch_up: 3}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: schedule.max_catch_up: only meaningful with misfire: catch_up",
    ),
    (
        "policy_errors",
        "
            name: etl
            schedule: {cron: '0 2 * * *', misfire: catch_up, max_catch_up: 0}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: schedule.max_catch_up: must be between 1 and 10000, found 0",
    ),
    (
        "policy_errors",
        "
            name: etl
            schedule: {cron: '0 2 * * *', overlap: sometimes}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: schedule.overlap: unknown overlap policy \"sometimes\": expected \
         allow, skip, queue or replace",
    ),
    (
        "policy_errors",
        "
            name: etl
            schedule: {cron: '0 2 * * *', start: tomorrow}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: schedule.start: invalid date \"tomorrow\": expected 2026-01-31, \
         2026-01-31T08:30:00 or 2026-01-31T08:30:00+08:00",
    ),
    (
        "policy_errors",
        "
            name: etl
            schedule: {cron: '0 2 * * *', start: 2026-02-01, end: 2026-01-01}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: schedule.end: is before schedule.start",
    ),
    (
        "policy_errors",
        "
            name: etl
            concurrency: {key: customer}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: concurrency.key: key template \"customer\" names no param: use \
         ${name}, e.g. \"${customer}\"",
    ),
    (
        "policy_errors",
        "
            name: etl
            concurrency: {key: '${cust-id}'}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: concurrency.key: \"${cust-id}\" in key template \"${cust-id}\" is not \
         a param name ([A-Za-z_][A-Za-z0-9_]*)",
    ),
    (
        "policy_errors",
        "
            name: etl
            concurrency: {key: '${c'}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: concurrency.key: unclosed \"${\" in key template \"${c\"",
    ),
    (
        "policy_errors",
        "
            name: etl
            concurrency: {max_runs_per_key: 2}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: concurrency.max_runs_per_key: only meaningful with concurrency.key",
    ),
    (
        "policy_errors",
        "
            name: etl
            concurrency: {limit: 2}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: concurrency.limit: unknown field \"limit\"; allowed fields: \
         max_running_tasks, key, max_runs_per_key",
    ),
    (
        "policy_errors",
        "
            name: etl
            tasks: [{name: a, command: x, routing: nearest}]
        ",
        "wf.yaml:2: tasks[0].routing: unknown routing \"nearest\": expected default, \
         least_running, round_robin, random, consistent_hash, failover or \
         sharded_broadcast",
    ),
    (
        "policy_errors",
        "
            name: etl
            tasks: [{name: a, command: x, pool: ETL}]
        ",
        "wf.yaml:2: tasks[0].pool: invalid name \"ETL\": expected 1 to 64 of a-z, 0-9, \
         '_', '.', '-', starting with a letter or digit",
    ),
    (
        "schedule_errors",
        "
            name: etl
            schedule:
              cron: '* * *'
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: schedule.cron: invalid cron expression \"* * *\": cron expression \"* \
         * *\" has 3 fields; expected 5 (minute hour day-of-month month day-of-week) or 6 \
         (a leading second field, then those 5)",
    ),
    (
        "schedule_errors",
        "
            name: etl
            schedule:
              cron: '0 3 * * *'
              timezone: Mars/Olympus_Mons
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:4: schedule.timezone: unknown time zone \"Mars/Olympus_Mons\": expected \
         an IANA name such as UTC or Asia/Shanghai",
    ),
    (
        "schedule_errors",
        "
            name: etl
            schedule:
              cron: ''
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: schedule.cron: must not be empty",
    ),
    (
        "unknown_fields_name_the_allowed_ones",
        "
            name: etl
            schedul:
              cron: '0 * * * *'
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: schedul: unknown field \"schedul\"; allowed fields: name, app, owner, \
         description, schedule, concurrency, retention, defaults, tasks, on_failure, on_success, deadline, \
         on_deadline, params",
    ),
    (
        "unknown_fields_name_the_allowed_ones",
        "
            name: etl
            tasks:
              - name: a
                command: x
                retires: 3
        ",
        "wf.yaml:5: tasks[0].retires: unknown field \"retires\"; allowed fields: name, \
         command, argv, timeout, retries, retry_backoff, env, working_dir, labels, \
         priority, upstream, concurrency, pool, routing, self_fence, survive_worker_restart, trigger_rule, if, \
         for_each, max_items, run_workflow, params",
    ),
    (
        "unknown_fields_name_the_allowed_ones",
        "
            name: etl
            schedule:
              cron: '0 * * * *'
              trigger: cron
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:4: schedule.trigger: unknown field \"trigger\"; allowed fields: cron, \
         timezone, misfire, max_catch_up, overlap, max_active_runs, start, end, after",
    ),
    (
        "unknown_fields_name_the_allowed_ones",
        "
            name: etl
            defaults:
              priority: 3
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: defaults.priority: unknown field \"priority\"; allowed fields: \
         timeout, retries, retry_backoff, labels, env",
    ),
    (
        "wrong_types",
        "- a\n",
        "wf.yaml:1: (root): expected a mapping, found a list",
    ),
    (
        "wrong_types",
        "just text\n",
        "wf.yaml:1: (root): expected a mapping, found a string",
    ),
    (
        "wrong_types",
        "
            name: [etl]
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:1: name: expected a string, found a list",
    ),
    (
        "wrong_types",
        "
            name: etl
            tasks: {a: {command: x}}
        ",
        "wf.yaml:2: tasks: expected a list of tasks, found a mapping",
    ),
    (
        "wrong_types",
        "
            name: etl
            schedule: daily
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: schedule: expected a mapping, found a string",
    ),
    (
        "wrong_types",
        "
            name: etl
            tasks:
              - just-a-name
        ",
        "wf.yaml:3: tasks[0]: expected a mapping, found a string",
    ),
    (
        "wrong_types",
        "
            name: etl
            tasks:
              - name: a
                command: x
                env: [A]
        ",
        "wf.yaml:5: tasks[0].env: expected a mapping, found a list",
    ),
    (
        "wrong_types",
        "
            name: etl
            tasks:
              - name: a
                command: x
                env: {A: [1]}
        ",
        "wf.yaml:5: tasks[0].env.A: expected a string, found a list",
    ),
    (
        "wrong_types",
        "
            name: etl
            tasks:
              - name: a
                command: x
                retries: '3'
        ",
        "wf.yaml:5: tasks[0].retries: expected an integer, found a string",
    ),
    (
        "wrong_types",
        "
            name: etl
            tasks:
              - name: a
                command: x
                priority: 1.5
        ",
        "wf.yaml:5: tasks[0].priority: expected an integer, found a number",
    ),
    (
        "wrong_types",
        "
            name: etl
            tasks:
              - name: a
                command: x
                self_fence: 'no'
        ",
        "wf.yaml:5: tasks[0].self_fence: expected true or false, found a string",
    ),
    (
        "wrong_types",
        "
            name: etl
            tasks:
              - name: a
                argv: ./run.sh
        ",
        "wf.yaml:4: tasks[0].argv: expected a list of strings, found a string",
    ),
    (
        "wrong_types",
        "
            name: etl
            tasks:
              - name: a
                argv:
                  - ./run.sh
                  - {x: 1}
        ",
        "wf.yaml:6: tasks[0].argv[1]: expected a string, found a mapping",
    ),
    (
        "wrong_types",
        "
            name: etl
            tasks:
              - name: a
                command: x
                upstream: {b: 1}
        ",
        "wf.yaml:5: tasks[0].upstream: expected a task name or a list of task names, \
         found a mapping",
    ),
    (
        "wrong_types",
        "
            name: etl
            tasks:
              - name: a
                command: x
                timeout: [1]
        ",
        "wf.yaml:5: tasks[0].timeout: expected a duration, found a list",
    ),
    (
        "wrong_types",
        "
            name: etl
            {[a]: 1}: x
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: (root): keys must be strings, found a mapping",
    ),
    (
        "yaml_level_errors",
        "
            name: etl
             tasks: x
        ",
        "wf.yaml:2: (yaml): mapping values are not allowed in this context",
    ),
    (
        "yaml_level_errors",
        "
            name: etl
            tasks: [{name: a, command: x}]
            ---
            name: other
        ",
        "wf.yaml:3: (yaml): a workflow file holds exactly one YAML document",
    ),
    (
        "yaml_level_errors",
        "
            name: &n etl
            tasks: [{name: *n, command: x}]
        ",
        "wf.yaml:2: (yaml): YAML aliases are not supported",
    ),
    (
        "declared_params",
        "
            name: etl
            params:
              1day: {default: x}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: params.1day: invalid param name \"1day\": expected [A-Za-z_][A-Za-z0-9_]* \
         of at most 128 bytes, as tasks get it as AX_PARAM_<NAME>",
    ),
    (
        "declared_params",
        "
            name: etl
            params:
              env: {required: true, default: prod}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: params.env.required: a param with a default is never missing: drop \
         required or the default",
    ),
    (
        "declared_params",
        "
            name: etl
            params:
              env:
                choices: [staging, prod]
                default: qa
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:5: params.env.default: \"qa\" is not one of the choices (staging, prod)",
    ),
    (
        "declared_params",
        "
            name: etl
            params:
              env:
                choices: [staging, staging]
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:4: params.env.choices[1]: duplicate choice \"staging\"",
    ),
    (
        "declared_params",
        "
            name: etl
            params:
              env: {choices: []}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: params.env.choices: must list at least one value",
    ),
    (
        "declared_params",
        "
            name: etl
            params:
              env: {colour: red}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: params.env.colour: unknown field \"colour\"; allowed fields: description, \
         default, required, choices",
    ),
    (
        "declared_params",
        "
            name: etl
            params:
              env: {required: yes}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:3: params.env.required: expected true or false, found a string",
    ),
    (
        "declared_params",
        "
            name: etl
            params: [env]
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:2: params: expected a mapping, found a list",
    ),
    (
        "declared_params",
        "
            name: etl
            schedule: {cron: '0 * * * *'}
            params:
              day: {default: today}
              env: {required: true}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:5: params.env: param \"env\" is required without a default, but this \
         workflow's runs also start from a cron schedule (schedule.cron), which pass no params: \
         give it a default",
    ),
    (
        "declared_params",
        "
            name: etl
            schedule: {after: [extract]}
            params:
              env: {required: true}
            tasks: [{name: a, command: x}]
        ",
        "wf.yaml:4: params.env: param \"env\" is required without a default, but this \
         workflow's runs also start from upstream workflows (schedule.after), which pass no \
         params: give it a default",
    ),
];

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn canonical_example_round_trip() {
    let parsed = parse_ok(EXAMPLE);
    let expected = WorkflowSpec {
        name: "daily-sales-etl".into(),
        app: "analytics".into(),
        owner: "data-team@example.com".into(),
        description: "Nightly sales rollup".into(),
        schedule: ScheduleSpec {
            trigger: TriggerKind::Cron,
            cron: Some("30 2 * * *".into()),
            timezone: "Asia/Shanghai".into(),
            ..ScheduleSpec::default()
        },
        concurrency: ConcurrencySpec::default(),
        retention: None,
        tasks: vec![
            TaskSpec {
                name: "extract_orders".into(),
                command: "./extract.sh orders".into(),
                argv: vec![],
                env: map(&[("SOURCE", "orders"), ("TZ", "Asia/Shanghai")]),
                working_dir: Some("/tmp".into()),
                timeout_ms: NonZeroU64::new(600_000),
                retries: 3,
                retry_backoff_ms: 30_000,
                labels: map(&[("pool", "etl"), ("region", "cn")]),
                priority: 10,
                upstream: vec![],
                ..TaskSpec::default()
            },
            TaskSpec {
                name: "extract_refunds".into(),
                command: String::new(),
                argv: strings(&["./extract.sh", "refunds"]),
                env: map(&[("TZ", "UTC")]),
                working_dir: None,
                timeout_ms: NonZeroU64::new(1_800_000),
                retries: 2,
                retry_backoff_ms: 10_000,
                labels: map(&[("pool", "etl")]),
                priority: 0,
                upstream: vec![],
                ..TaskSpec::default()
            },
            TaskSpec {
                name: "load".into(),
                command: "./load.sh".into(),
                env: map(&[("TZ", "UTC")]),
                timeout_ms: NonZeroU64::new(1_800_000),
                retries: 2,
                retry_backoff_ms: 10_000,
                labels: map(&[("pool", "etl")]),
                upstream: strings(&["extract_orders", "extract_refunds"]),
                ..TaskSpec::default()
            },
            TaskSpec {
                name: "report".into(),
                command: "./report.sh".into(),
                env: map(&[("TZ", "UTC")]),
                timeout_ms: NonZeroU64::new(1_800_000),
                retries: 2,
                retry_backoff_ms: 10_000,
                labels: map(&[("pool", "etl")]),
                upstream: strings(&["load"]),
                ..TaskSpec::default()
            },
        ],
        deadline: None,
        on_deadline: Default::default(),
        params: Vec::new(),
    };
    assert_eq!(parsed.spec, expected);
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);

    // The model survives serialization unchanged (the store and the API carry it as JSON).
    let json = serde_json::to_string(&parsed.spec).unwrap();
    let back: WorkflowSpec = serde_json::from_str(&json).unwrap();
    assert_eq!(back, parsed.spec);

    let dag = parsed.spec.dag().unwrap();
    assert_eq!(dag.roots(), ["extract_orders", "extract_refunds"]);
    assert_eq!(dag.downstream("load"), ["report"]);
}

#[test]
fn minimal_workflow_gets_the_defaults() {
    let parsed = parse_ok(
        "
        name: one
        tasks:
          - name: only
            command: echo hi
        ",
    );
    assert_eq!(parsed.spec.app, DEFAULT_APP);
    assert_eq!(parsed.spec.schedule, ScheduleSpec::default());
    assert_eq!(parsed.spec.schedule.trigger, TriggerKind::Manual);
    let task = &parsed.spec.tasks[0];
    assert_eq!(task.timeout_ms, None);
    assert_eq!(task.retries, 0);
    assert_eq!(task.retry_backoff_ms, DEFAULT_RETRY_BACKOFF_MS);
    assert_eq!(task.priority, 0);
    assert!(task.env.is_empty() && task.labels.is_empty() && task.upstream.is_empty());
    // A lone task is a workflow of one, not an isolated task.
    assert!(parsed.warnings.is_empty());
}

#[test]
fn nulls_mean_absent_and_schedule_without_cron_is_manual() {
    let parsed = parse_ok(
        "
        name: etl
        owner:
        description: ~
        schedule:
          timezone: Europe/Paris
        defaults:
        tasks:
          - name: a
            command: x
            upstream:
            priority: -2147483648
        ",
    );
    assert_eq!(parsed.spec.owner, "");
    assert_eq!(parsed.spec.description, "");
    assert_eq!(
        parsed.spec.schedule,
        ScheduleSpec {
            trigger: TriggerKind::Manual,
            cron: None,
            timezone: "Europe/Paris".into(),
            ..ScheduleSpec::default()
        }
    );
    assert_eq!(parsed.spec.tasks[0].priority, i32::MIN);
}

#[test]
fn scalars_become_strings_where_strings_are_expected() {
    let parsed = parse_ok(
        "
        name: 2024
        schedule: {cron: '@daily'}
        tasks:
          - name: a
            argv: [sleep, 10]
            env: {PORT: 8080, DEBUG: true, EMPTY: ''}
            timeout: 90
            retry_backoff: '500ms'
        ",
    );
    assert_eq!(parsed.spec.name, "2024");
    assert_eq!(parsed.spec.schedule.trigger, TriggerKind::Cron);
    let task = &parsed.spec.tasks[0];
    assert_eq!(task.argv, ["sleep", "10"]);
    assert_eq!(
        task.env,
        map(&[("PORT", "8080"), ("DEBUG", "true"), ("EMPTY", "")])
    );
    assert_eq!(task.timeout_ms, NonZeroU64::new(90_000));
    assert_eq!(task.retry_backoff_ms, 500);
}

#[test]
fn isolated_tasks_are_warnings() {
    let parsed = parse_ok(
        "
        name: etl
        tasks:
          - {name: a, command: x}
          - {name: b, command: x, upstream: a}
          - {name: lonely, command: x}
          - {name: alone, command: x}
        ",
    );
    assert_eq!(
        parsed.warnings,
        [
            "task lonely has no upstream and no downstream",
            "task alone has no upstream and no downstream"
        ]
    );
}

/// A workflow file's durations read by the one grammar (`crate::duration`, whose table holds
/// every form), in whole milliseconds.
#[test]
fn durations() {
    let backoff = |text: &str| {
        parse_workflow(
            &format!("{{name: etl, tasks: [{{name: a, command: x, retry_backoff: '{text}'}}]}}"),
            FILE,
        )
        .map(|parsed| parsed.spec.tasks[0].retry_backoff_ms)
        .map_err(|err| err.to_string())
    };
    for (text, ms) in [
        ("0", 0),
        ("90", 90_000),
        ("500ms", 500),
        ("45s", 45_000),
        ("10m", 600_000),
        ("2h", 7_200_000),
        ("1h30m", 5_400_000),
        ("1h30m15s500ms", 5_415_500),
        ("0s", 0),
        ("90d", 90 * 86_400_000),
        ("1d12h", 36 * 3_600_000),
        ("1.5h", 5_400_000),
        ("10 m", 600_000),
        ("1.5", 1_500),
        ("1.9ms", 1),
    ] {
        assert_eq!(backoff(text), Ok(ms), "{text}");
    }
    for text in [
        "",
        "30m1h",
        "1h1h",
        "10x",
        "-5s",
        "-5",
        "h",
        "1h1d",
        "5ms3s",
        "1.5 hours",
    ] {
        let err = backoff(text).unwrap_err();
        assert!(
            err.starts_with(&format!(
                "wf.yaml:1: tasks[0].retry_backoff: invalid duration \"{text}\""
            )),
            "{text}: {err}"
        );
    }
    assert_eq!(
        backoff("99999999999999999h"),
        Err(
            "wf.yaml:1: tasks[0].retry_backoff: duration \"99999999999999999h\" is too large"
                .to_string()
        )
    );
    assert_eq!(
        backoff("99999999999999999999"),
        Err(
            "wf.yaml:1: tasks[0].retry_backoff: duration \"99999999999999999999\" is too large"
                .to_string()
        )
    );
}

#[test]
fn names() {
    for ok in ["a", "0", "daily-sales-etl", "x.y_z", &"a".repeat(64)] {
        assert!(is_valid_name(ok), "{ok}");
    }
    for bad in ["", "A", "-a", "_a", ".a", "a b", "été", &"a".repeat(65)] {
        assert!(!is_valid_name(bad), "{bad}");
    }
    for ok in ["A", "_", "PATH", "my_var2"] {
        assert!(is_valid_env_name(ok), "{ok}");
    }
    for bad in ["", "1A", "A-B", "A.B", "É"] {
        assert!(!is_valid_env_name(bad), "{bad}");
    }
}

#[test]
fn self_fence_is_on_unless_a_task_opts_out() {
    let parsed = parse_ok(
        "
        name: etl
        tasks:
          - {name: a, command: x}
          - {name: b, command: x, self_fence: false}
          - {name: c, command: x, self_fence: true}
        ",
    );
    let unfenced: Vec<bool> = parsed.spec.tasks.iter().map(|t| t.unfenced).collect();
    assert_eq!(unfenced, [false, true, false]);
}

#[test]
fn env_values_may_name_secrets_and_a_task_overrides_its_defaults() {
    let parsed = parse_ok(
        "
        name: etl
        defaults:
          env: {DB_PASSWORD: {secret: warehouse-db}, REGION: cn}
        tasks:
          - {name: a, command: x}
          - name: b
            command: x
            env: {DB_PASSWORD: not-secret, API_KEY: {secret: api-key}}
        ",
    );
    let a = &parsed.spec.tasks[0];
    assert_eq!(a.env, map(&[("REGION", "cn")]));
    assert_eq!(a.secret_env, map(&[("DB_PASSWORD", "warehouse-db")]));
    let b = &parsed.spec.tasks[1];
    assert_eq!(
        b.env,
        map(&[("DB_PASSWORD", "not-secret"), ("REGION", "cn")])
    );
    assert_eq!(b.secret_env, map(&[("API_KEY", "api-key")]));
}

#[test]
fn unknown_fields_name_the_allowed_ones() {
    check_refusals("unknown_fields_name_the_allowed_ones");
}

#[test]
fn wrong_types() {
    check_refusals("wrong_types");
}

#[test]
fn missing_required_fields() {
    check_refusals("missing_required_fields");
}

#[test]
fn bad_names() {
    check_refusals("bad_names");
}

#[test]
fn retention_refusals() {
    check_refusals("retention");
}

#[test]
fn retention_is_a_duration_forever_or_the_cluster_default() {
    let with = |line: &str| {
        parse_ok(&format!(
            "name: etl\n{line}tasks: [{{name: a, command: x}}]\n"
        ))
        .spec
        .retention
    };
    assert_eq!(
        with("retention: 90d\n"),
        Some(Retention::Keep {
            ms: 90 * 86_400_000
        })
    );
    assert_eq!(
        with("retention: 1d12h\n"),
        Some(Retention::Keep { ms: 36 * 3_600_000 })
    );
    assert_eq!(with("retention: forever\n"), Some(Retention::Forever));
    assert_eq!(with(""), None);
    // Unset, the field stays out of the stored JSON: versions stored before it read the same.
    let spec = parse_ok("name: etl\ntasks: [{name: a, command: x}]\n").spec;
    let json = serde_json::to_string(&spec).unwrap();
    assert!(!json.contains("retention"), "{json}");
    let kept = parse_ok("name: etl\nretention: 2h\ntasks: [{name: a, command: x}]\n").spec;
    let json = serde_json::to_string(&kept).unwrap();
    assert_eq!(serde_json::from_str::<WorkflowSpec>(&json).unwrap(), kept);
}

/// No timeout, or `timeout: 0`, is `None`; stored JSON keeps 0 for it, and reads it back.
#[test]
fn a_task_without_a_timeout_has_none() {
    let spec = parse_ok(
        "name: etl\ntasks: [{name: a, command: x}, {name: b, command: x, timeout: 0}, \
         {name: c, command: x, timeout: 2s}]\n",
    )
    .spec;
    let timeouts: Vec<_> = spec.tasks.iter().map(|task| task.timeout_ms).collect();
    assert_eq!(timeouts, [None, None, NonZeroU64::new(2_000)]);
    let json = serde_json::to_value(&spec).unwrap();
    let stored: Vec<_> = (0..3)
        .map(|i| json["tasks"][i]["timeout_ms"].clone())
        .collect();
    assert_eq!(stored, [0, 0, 2_000]);
    assert_eq!(serde_json::from_value::<WorkflowSpec>(json).unwrap(), spec);
}

#[test]
fn bad_durations_and_numbers() {
    check_refusals("bad_durations_and_numbers");
}

#[test]
fn env_and_labels() {
    check_refusals("env_and_labels");
}

#[test]
fn command_and_argv() {
    check_refusals("command_and_argv");
}

#[test]
fn graph_errors_point_at_the_line() {
    check_refusals("graph_errors_point_at_the_line");
}

#[test]
fn a_trigger_must_give_the_params_the_key_names() {
    let keyed = parse_ok(
        "{name: etl, concurrency: {key: '${customer}-${region}-${customer}'}, \
         tasks: [{name: a, command: x}]}",
    );
    let concurrency = &keyed.spec.concurrency;
    let params = map(&[("customer", "acme")]);
    assert_eq!(concurrency.missing_key_params(&params), ["region"]);
    assert_eq!(
        concurrency.missing_key_params(&map(&[])),
        ["customer", "region"]
    );
    let err = concurrency.check_trigger_params(&params).unwrap_err();
    assert!(
        err.starts_with("missing param region for concurrency.key \"${customer}-${region}"),
        "{err}"
    );
    assert!(err.contains("--param region=VALUE"), "{err}");
    let full = map(&[("customer", "acme"), ("region", "eu")]);
    assert_eq!(concurrency.check_trigger_params(&full), Ok(()));
    // Without a key nothing is required.
    assert_eq!(
        ConcurrencySpec::default().check_trigger_params(&map(&[])),
        Ok(())
    );
}

#[test]
fn schedule_policies_and_concurrency() {
    let parsed = parse_ok(
        "
        name: etl
        schedule:
          cron: '0 2 * * *'
          timezone: Asia/Shanghai
          misfire: catch_up
          max_catch_up: 3
          overlap: queue
          max_active_runs: 2
          start: 2026-01-01
          end: 2026-06-30T18:00:00Z
        concurrency:
          max_running_tasks: 10
          key: 'cust-${customer}-${region}'
          max_runs_per_key: 2
        tasks:
          - {name: a, command: x, concurrency: 3, pool: etl, routing: sharded_broadcast}
          - {name: b, command: x, upstream: a}
        ",
    );
    let schedule = &parsed.spec.schedule;
    assert_eq!(schedule.misfire, MisfirePolicy::CatchUp { max: 3 });
    assert_eq!(schedule.overlap, OverlapPolicy::Queue);
    assert_eq!(schedule.max_active_runs, 2);
    // Midnight in Shanghai is 16:00 UTC the day before.
    assert_eq!(schedule.start_at, Some(1_767_196_800_000));
    assert_eq!(schedule.end_at, Some(1_782_842_400_000));
    let concurrency = &parsed.spec.concurrency;
    assert_eq!(concurrency.max_running_tasks, 10);
    assert_eq!(concurrency.max_runs_per_key, 2);
    let params = map(&[("customer", "acme"), ("region", "eu")]);
    assert_eq!(
        concurrency.run_key(&params).as_deref(),
        Some("cust-acme-eu")
    );
    assert_eq!(
        concurrency.run_key(&map(&[])).as_deref(),
        Some("cust--"),
        "a missing param is empty"
    );
    let a = &parsed.spec.tasks[0];
    assert_eq!((a.concurrency, a.pool.as_deref()), (3, Some("etl")));
    assert_eq!(a.routing, Routing::ShardedBroadcast);
    assert_eq!(parsed.spec.tasks[1].routing, Routing::Default);

    let defaults = parse_ok("{name: etl, tasks: [{name: a, command: x}]}").spec;
    assert_eq!(defaults.schedule.misfire, MisfirePolicy::FireOnce);
    assert_eq!(defaults.schedule.overlap, OverlapPolicy::Allow);
    assert_eq!(defaults.concurrency, ConcurrencySpec::default());
    assert_eq!(defaults.concurrency.run_key(&params), None);
    let keyed = parse_ok("{name: etl, concurrency: {key: '${c}'}, tasks: [{name: a, command: x}]}");
    assert_eq!(keyed.spec.concurrency.max_runs_per_key, 1);
}

#[test]
fn a_dependency_trigger_names_its_upstream_workflows() {
    check_refusals("a_dependency_trigger_names_its_upstream_workflows");
    let parsed = parse_ok(
        "
        name: report
        schedule: {after: [ingest, dims]}
        tasks: [{name: a, command: x}]
        ",
    );
    assert_eq!(parsed.spec.schedule.trigger, TriggerKind::Dependency);
    assert_eq!(parsed.spec.schedule.after, strings(&["ingest", "dims"]));
    let single = parse_ok("{name: r, schedule: {after: ingest}, tasks: [{name: a, command: x}]}");
    assert_eq!(single.spec.schedule.after, strings(&["ingest"]));
}

#[test]
fn policy_errors() {
    check_refusals("policy_errors");
}

#[test]
fn instants_in_a_time_zone() {
    let ny: chrono_tz::Tz = "America/New_York".parse().unwrap();
    // 2026-03-08 02:30 does not exist in New York: it moves past the gap to 03:00 EDT.
    assert_eq!(
        parse_instant("2026-03-08T02:30", ny),
        parse_instant("2026-03-08T03:00:00-04:00", chrono_tz::UTC)
    );
    // 2026-11-01 01:30 happens twice: the first (EDT) is taken.
    assert_eq!(
        parse_instant("2026-11-01 01:30:00", ny),
        parse_instant("2026-11-01T05:30:00Z", chrono_tz::UTC)
    );
    assert_eq!(parse_instant("2026-13-01", ny), None);
    // A bare date as the end of a range takes in its whole day, in the zone.
    assert_eq!(
        parse_range_end("2026-01-31", ny),
        parse_instant("2026-02-01T05:00:00Z", chrono_tz::UTC).map(|ms| ms - 1)
    );
    assert_eq!(
        parse_range_end("2026-01-31T08:30", ny),
        parse_instant("2026-01-31T08:30", ny)
    );
    assert_eq!(parse_range_end("2026-02-30", ny), None);
    assert_eq!(parse_instant("", ny), None);
}

#[test]
fn schedule_errors() {
    check_refusals("schedule_errors");
}

#[test]
fn duplicate_keys() {
    check_refusals("duplicate_keys");
}

#[test]
fn yaml_level_errors() {
    check_refusals("yaml_level_errors");
    // Deep nesting is refused by the reader's depth limit, before serde builds anything.
    let deep = format!("name: etl\ntasks: {}{}\n", "[".repeat(40), "]".repeat(40));
    assert_eq!(
        parse_workflow(&deep, FILE).unwrap_err().to_string(),
        "wf.yaml:2: (yaml): nesting deeper than 32 levels"
    );
    // Far deeper nesting is stopped by the scanner itself, without exhausting the stack.
    let deeper = format!("name: etl\ntasks: {}\n", "[".repeat(100_000));
    assert_eq!(
        parse_workflow(&deeper, FILE).unwrap_err().to_string(),
        "wf.yaml:2: (yaml): recursion limit exceeded"
    );
}

#[test]
fn wide_file_parses() {
    let mut yaml = String::from("name: big\ntasks:\n");
    for i in 0..2_000 {
        yaml.push_str(&format!("  - name: t{i}\n    command: run {i}\n"));
        if i > 0 {
            yaml.push_str(&format!("    upstream: t{}\n", i - 1));
        }
    }
    let parsed = parse_workflow(&yaml, FILE).unwrap();
    assert_eq!(parsed.spec.tasks.len(), 2_000);
    assert_eq!(parsed.spec.dag().unwrap().roots(), ["t0"]);
}

#[test]
fn trigger_rules_and_handlers_are_read() {
    let parsed = parse_ok(
        "
            name: etl
            tasks:
              - {name: extract, command: x}
              - {name: load, command: y, upstream: extract}
              - {name: cleanup, command: z, upstream: [extract, load], trigger_rule: all_done}
            on_failure:
              - {name: page, command: p}
              - {name: ticket, command: t, upstream: page}
            on_success:
              - {name: notify, command: n}
        ",
    );
    let spec = &parsed.spec;
    let rules: Vec<_> = spec.tasks.iter().map(|t| t.trigger_rule.as_str()).collect();
    assert_eq!(
        rules,
        [
            "all_success",
            "all_success",
            "all_done",
            "all_success",
            "all_success",
            "all_success"
        ]
    );
    let handlers: Vec<_> = spec.tasks.iter().map(|t| t.handler).collect();
    assert_eq!(
        handlers,
        [
            None,
            None,
            None,
            Some(Handler::OnFailure),
            Some(Handler::OnFailure),
            Some(Handler::OnSuccess)
        ]
    );
    let graph: Vec<_> = spec.graph_tasks().map(|t| t.name.as_str()).collect();
    assert_eq!(graph, ["extract", "load", "cleanup"]);
    // Handlers start with no run and are not isolated tasks of the graph.
    assert_eq!(spec.dag().unwrap().roots(), ["extract"]);
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    // The default rule and no handler leave the stored JSON as it was.
    let json = serde_json::to_string(&spec.tasks[0]).unwrap();
    assert!(
        !json.contains("trigger_rule") && !json.contains("handler"),
        "{json}"
    );
}

#[test]
fn an_always_task_starts_with_the_run() {
    let parsed = parse_ok(
        "
            name: etl
            tasks:
              - {name: a, command: x}
              - {name: watch, command: y, upstream: a, trigger_rule: always}
        ",
    );
    assert_eq!(parsed.spec.dag().unwrap().roots(), ["a", "watch"]);
}

#[test]
fn trigger_rule_refusals() {
    check_refusals("trigger_rules");
}

#[test]
fn output_references_name_tasks_above() {
    parse_ok(
        "
            name: etl
            tasks:
              - {name: extract, command: x}
              - {name: clean, command: y, upstream: extract}
              - name: load
                upstream: clean
                command: load --rows ${tasks.extract.outputs.rows} ${HOME}
            on_success:
              - {name: notify, command: 'echo ${tasks.load.outputs.table}'}
        ",
    );
}

#[test]
fn output_reference_refusals() {
    check_refusals("outputs");
}

#[test]
fn condition_refusals() {
    check_refusals("conditions");
}

#[test]
fn conditions_are_read_and_kept_as_written() {
    let parsed = parse_ok(
        "
            name: etl
            tasks:
              - {name: extract, command: x}
              - name: load
                upstream: extract
                command: y
                if: int(tasks.extract.outputs.rows) > 0 && params.mode != 'dry'
              - {name: plain, command: z, if: \"has(params.full)\"}
            on_failure:
              - name: page
                command: p
                if: has(tasks.extract.outputs.rows)
        ",
    );
    let conditions: Vec<Option<&str>> = parsed
        .spec
        .tasks
        .iter()
        .map(|t| t.condition.as_deref())
        .collect();
    assert_eq!(
        conditions,
        vec![
            None,
            Some("int(tasks.extract.outputs.rows) > 0 && params.mode != 'dry'"),
            Some("has(params.full)"),
            Some("has(tasks.extract.outputs.rows)"),
        ]
    );
    let json = serde_json::to_string(&parsed.spec).unwrap();
    assert!(json.contains("\"if\":\"has(params.full)\""), "{json}");
}

#[test]
fn deadline_refusals() {
    check_refusals("deadlines");
}

#[test]
fn a_deadline_is_a_time_of_day_days_after_or_a_duration() {
    use crate::deadline::{Deadline, OnDeadline};
    let with = |lines: &str| {
        let spec = parse_ok(&format!(
            "name: etl\nschedule: {{cron: '30 2 * * *', timezone: Asia/Shanghai}}\n{lines}\
             tasks: [{{name: a, command: x}}]\n"
        ))
        .spec;
        (spec.deadline, spec.on_deadline)
    };
    let wall = |days, hour, minute| Some(Deadline::WallClock { days, hour, minute });
    assert_eq!(with(""), (None, OnDeadline::Alert));
    assert_eq!(
        with("deadline: 06:30\n"),
        (wall(0, 6, 30), OnDeadline::Alert)
    );
    assert_eq!(
        with("deadline: '+1d 01:00'\n"),
        (wall(1, 1, 0), OnDeadline::Alert)
    );
    // Before 02:30 on the same day is refused, on the next day it is fine.
    assert_eq!(
        with("deadline: +1d 01:00\n"),
        (wall(1, 1, 0), OnDeadline::Alert)
    );
    assert_eq!(
        with("deadline: 2h\non_deadline: cancel\n"),
        (
            Some(Deadline::AfterStart { ms: 7_200_000 }),
            OnDeadline::Cancel
        )
    );
    // A workflow without cron cannot be checked at apply: its runs' logical times are their
    // triggers'.
    let manual = parse_ok("name: etl\ndeadline: 00:01\ntasks: [{name: a, command: x}]\n").spec;
    assert_eq!(manual.deadline, wall(0, 0, 1));
    // Unset, the fields stay out of the stored JSON: versions stored before them read the same.
    let json = serde_json::to_string(&with("").0).unwrap();
    assert_eq!(json, "null");
    let plain = parse_ok("name: etl\ntasks: [{name: a, command: x}]\n").spec;
    let json = serde_json::to_string(&plain).unwrap();
    assert!(!json.contains("deadline"), "{json}");
    let set = parse_ok(
        "name: etl\ndeadline: +1d 06:30\non_deadline: cancel\ntasks: [{name: a, command: x}]\n",
    )
    .spec;
    let json = serde_json::to_string(&set).unwrap();
    assert_eq!(serde_json::from_str::<WorkflowSpec>(&json).unwrap(), set);
}

#[test]
fn sub_workflow_refusals() {
    check_refusals("sub_workflows");
}

#[test]
fn a_run_workflow_task_is_read_with_its_params() {
    let parsed = parse_ok(
        "
            name: daily
            tasks:
              - {name: list, command: x}
              - name: load
                upstream: list
                run_workflow: load-region
                retries: 1
                params:
                  region: ${params.region}
                  day: ${tasks.list.outputs.day}
                  count: 3
        ",
    );
    let load = &parsed.spec.tasks[1];
    assert_eq!(load.run_workflow.as_deref(), Some("load-region"));
    assert_eq!(load.command, "");
    assert_eq!(load.retries, 1);
    assert_eq!(
        load.params,
        BTreeMap::from([
            ("count".to_string(), "3".to_string()),
            ("day".to_string(), "${tasks.list.outputs.day}".to_string()),
            ("region".to_string(), "${params.region}".to_string()),
        ])
    );
    // A task without run_workflow keeps the stored JSON of versions before the field.
    let json = serde_json::to_string(&parsed.spec.tasks[0]).unwrap();
    assert!(
        !json.contains("run_workflow") && !json.contains("params"),
        "{json}"
    );
}

#[test]
fn declared_params_refusals() {
    check_refusals("declared_params");
}

#[test]
fn params_are_declared_in_file_order_with_defaults_and_choices() {
    let parsed = parse_ok(
        "
        name: etl
        schedule: {cron: '0 2 * * *'}
        params:
          day:
            default: 2026-01-01
            description: The day to load
          limit: {default: 10}
          env:
            choices: [staging, prod]
            default: staging
          note:
        tasks: [{name: a, command: x}]
    ",
    );
    let params = &parsed.spec.params;
    let names: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["day", "limit", "env", "note"]);
    assert_eq!(params[0].default.as_deref(), Some("2026-01-01"));
    assert_eq!(params[0].description, "The day to load");
    assert_eq!(
        params[1].default.as_deref(),
        Some("10"),
        "a number is kept as typed"
    );
    assert_eq!(params[2].choices, strings(&["staging", "prod"]));
    assert_eq!(
        params[3],
        ParamSpec {
            name: "note".into(),
            ..ParamSpec::default()
        }
    );
    // Stored and read back unchanged; a spec without params stores no `params` key.
    let json = serde_json::to_string(&parsed.spec).unwrap();
    let back: WorkflowSpec = serde_json::from_str(&json).unwrap();
    assert_eq!(back, parsed.spec);
    let plain = parse_ok("name: x\ntasks: [{name: a, command: x}]\n");
    assert!(
        !serde_json::to_string(&plain.spec)
            .unwrap()
            .contains("params")
    );
}

#[test]
fn a_manual_workflow_may_require_a_param() {
    let parsed = parse_ok(
        "
        name: deploy
        params:
          env: {required: true, choices: [staging, prod], description: Where to}
        tasks: [{name: a, command: x}]
    ",
    );
    assert!(parsed.spec.params[0].required);
}
