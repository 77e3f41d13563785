//! A crontab as workflow files (`axctl import crontab`): one workflow per entry, its schedule
//! the entry's five time fields (a macro such as `@daily` spelled out), its zone from the
//! `CRON_TZ=` or `TZ=` line above it, its command under `command:` and the environment lines
//! above it under `env:`, as cron gives each entry the settings read before it.
//!
//! What cron does and ax has no equivalent for is said as a warning, never dropped silently:
//! `MAILTO`/`MAILFROM` (ax sends no mail; failures go to the alert webhooks), `@reboot` (no
//! start-up trigger: the entry is not imported), `RANDOM_DELAY`, and the user column of a
//! system crontab. What ax can express differently is translated: `SHELL=/bin/bash` makes the
//! task `argv: [/bin/bash, -c, COMMAND]` (how cron runs it), `\%` is a `%`, and the text after
//! an unescaped `%` (the command's standard input, one line per further `%`) is piped in with
//! `printf`. A line that is not an entry, a setting, a comment or blank is an error
//! `FILE:LINE: field: why`, and then no file is written at all.
//!
//! Names come from the command: the program's name without its directory and extension, and the
//! first argument that is a word (`/usr/local/bin/backup.sh --full` → `backup`, `php artisan
//! schedule:run` → `artisan-schedule-run`), skipping wrappers such as `cd DIR &&`, `nice`,
//! `flock FILE` and interpreters; a name taken by an earlier entry gets `-2`, `-3`, ….

use std::collections::{BTreeMap, BTreeSet};

use crate::cron::{CronSchedule, expand_macro, parse_timezone};
use crate::spec::{is_valid_env_name, is_valid_name};

/// How a crontab is read and its workflows named.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// The crontab's name in messages (its path, or `-` for standard input).
    pub file: String,
    /// The `app:` of every workflow (none: the default app).
    pub app: Option<String>,
    /// Put before every derived name (`web1-` gives `web1-backup`).
    pub prefix: String,
    /// The zone of the entries before any `CRON_TZ=`/`TZ=` line: cron reads them in the host's
    /// zone, which the file does not say. None: UTC, with a warning.
    pub timezone: Option<String>,
    /// A system crontab (`/etc/crontab`, `/etc/cron.d/*`): a user column follows the time
    /// fields.
    pub system: bool,
}

/// The workflow files of a crontab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    pub workflows: Vec<ImportedWorkflow>,
    /// `FILE:LINE: field: why` for what has no equivalent in ax.
    pub warnings: Vec<String>,
}

/// One entry as a workflow file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedWorkflow {
    pub name: String,
    /// The entry's line in the crontab, 1-based.
    pub line: usize,
    /// The workflow file's text (YAML).
    pub yaml: String,
}

/// The settings read so far, which each entry takes as they are at its line.
#[derive(Debug, Clone, Default)]
struct Settings {
    zone: Option<String>,
    shell: Option<String>,
    env: BTreeMap<String, String>,
}

/// One entry, parsed.
struct Entry<'a> {
    line: usize,
    text: &'a str,
    cron: String,
    command: String,
    input: Vec<String>,
}

/// Translates crontab `text`; every problem found is returned (`FILE:LINE: field: why`), in
/// line order, rather than the first alone.
pub fn import_crontab(text: &str, options: &ImportOptions) -> Result<Imported, Vec<String>> {
    let file = options.file.as_str();
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    if !options.prefix.is_empty() && !is_valid_name(&format!("{}x", options.prefix)) {
        errors.push(format!(
            "{file}:0: prefix: {:?} cannot start a workflow name: use lower-case letters, \
             digits, '_', '.' and '-', starting with a letter or digit",
            options.prefix
        ));
    }
    if let Some(app) = options.app.as_deref().filter(|app| !is_valid_name(app)) {
        errors.push(format!(
            "{file}:0: app: invalid app name {app:?}: expected [a-z0-9][a-z0-9_.-]{{0,63}}"
        ));
    }
    if let Some(zone) = &options.timezone
        && let Err(err) = parse_timezone(zone)
    {
        errors.push(format!("{file}:0: timezone: {err}"));
    }
    let mut settings = Settings {
        zone: options.timezone.clone(),
        ..Settings::default()
    };
    let mut taken = BTreeSet::new();
    let mut workflows = Vec::new();
    let mut users_warned = BTreeSet::new();
    let mut zone_used_unset = None;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if let Some((name, value)) = setting(trimmed) {
            apply_setting(
                &mut settings,
                name,
                value,
                file,
                line,
                &mut errors,
                &mut warnings,
            );
            continue;
        }
        let entry = match parse_entry(trimmed, options.system, file, line) {
            Ok(Parsed::Entry { entry, user }) => {
                if let Some(user) = user
                    && users_warned.insert(user.to_string())
                {
                    warnings.push(format!(
                        "{file}:{line}: user: ax runs every task as its worker's user \
                         (ax-worker --task-user chooses it); the user column ({user}) is not \
                         imported"
                    ));
                }
                entry
            }
            Ok(Parsed::Reboot) => {
                warnings.push(format!(
                    "{file}:{line}: @reboot: ax has no start-up trigger; the entry is not \
                     imported: {}",
                    printable(trimmed)
                ));
                continue;
            }
            Err(error) => {
                errors.push(error);
                continue;
            }
        };
        if settings.zone.is_none() && zone_used_unset.is_none() {
            zone_used_unset = Some(line);
        }
        let base = derive_name(&entry.command);
        let name = unique_name(&options.prefix, &base, &mut taken);
        workflows.push(ImportedWorkflow {
            yaml: render(&entry, &name, &base, &settings, options),
            name,
            line: entry.line,
        });
    }
    if let Some(line) = zone_used_unset {
        warnings.push(format!(
            "{file}:{line}: timezone: no CRON_TZ= or TZ= line before this entry: its schedule \
             is read in UTC, where cron read it in the host's zone (give --timezone ZONE to say \
             which)"
        ));
    }
    if errors.is_empty() {
        Ok(Imported {
            workflows,
            warnings,
        })
    } else {
        Err(errors)
    }
}

/// `NAME=value` (spaces allowed around `=`), the value unquoted as cron does: quotes keep
/// leading and trailing blanks.
fn setting(line: &str) -> Option<(&str, String)> {
    let end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(line.len());
    let name = &line[..end];
    let rest = line[end..].trim_start().strip_prefix('=')?;
    if !is_valid_env_name(name) {
        return None;
    }
    let value = rest.trim();
    let unquoted = ['"', '\'']
        .iter()
        .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)));
    Some((name, unquoted.unwrap_or(value).to_string()))
}

fn apply_setting(
    settings: &mut Settings,
    name: &str,
    value: String,
    file: &str,
    line: usize,
    errors: &mut Vec<String>,
    warnings: &mut Vec<String>,
) {
    match name {
        "CRON_TZ" | "TZ" => match parse_timezone(&value) {
            Ok(_) => {
                settings.zone = Some(value.clone());
                // TZ is also in the command's environment under cron; CRON_TZ is not.
                if name == "TZ" {
                    settings.env.insert(name.to_string(), value);
                }
            }
            Err(err) => errors.push(format!("{file}:{line}: {name}: {err}")),
        },
        "MAILTO" | "MAILFROM" => warnings.push(format!(
            "{file}:{line}: {name}: ax sends no mail; failed runs go to the alert webhooks \
             ([alerts] in the scheduler's configuration): not imported"
        )),
        "RANDOM_DELAY" => warnings.push(format!(
            "{file}:{line}: {name}: ax fires at the scheduled time, with no random delay: not \
             imported"
        )),
        "SHELL" => settings.shell = (value != "/bin/sh").then_some(value),
        _ => {
            settings.env.insert(name.to_string(), value);
        }
    }
}

enum Parsed<'a> {
    Entry {
        entry: Entry<'a>,
        user: Option<&'a str>,
    },
    Reboot,
}

/// The next whitespace-separated word of `text`, and the rest after the blanks that follow it.
fn next_word(text: &str) -> Option<(&str, &str)> {
    let text = text.trim_start();
    if text.is_empty() {
        return None;
    }
    let end = text.find(char::is_whitespace).unwrap_or(text.len());
    Some((&text[..end], text[end..].trim_start()))
}

fn parse_entry<'a>(
    text: &'a str,
    system: bool,
    file: &str,
    line: usize,
) -> Result<Parsed<'a>, String> {
    let (cron, rest) = if text.starts_with('@') {
        let Some((word, rest)) = next_word(text) else {
            return Err(format!("{file}:{line}: entry: empty"));
        };
        if word.eq_ignore_ascii_case("@reboot") {
            return Ok(Parsed::Reboot);
        }
        let expanded = expand_macro(&word[1..]).ok_or_else(|| {
            format!(
                "{file}:{line}: schedule: unknown macro {word:?}; expected @reboot, @yearly, \
                 @annually, @monthly, @weekly, @daily, @midnight or @hourly"
            )
        })?;
        (expanded.to_string(), rest)
    } else {
        let mut fields = Vec::with_capacity(5);
        let mut rest = text;
        while fields.len() < 5 {
            match next_word(rest) {
                Some((word, after)) => {
                    fields.push(word);
                    rest = after;
                }
                None => break,
            }
        }
        if fields.len() < 5 || rest.is_empty() {
            return Err(format!(
                "{file}:{line}: entry: expected five time fields (minute hour day-of-month month \
                 day-of-week) and a command, or NAME=value: {}",
                printable(text)
            ));
        }
        (fields.join(" "), rest)
    };
    if let Err(err) = CronSchedule::parse(&cron) {
        return Err(format!("{file}:{line}: schedule: {err}"));
    }
    let (user, rest) = if system {
        match next_word(rest) {
            Some((user, command)) if !command.is_empty() => (Some(user), command),
            _ => {
                return Err(format!(
                    "{file}:{line}: entry: a system crontab entry needs a user and a command \
                     after its schedule"
                ));
            }
        }
    } else {
        (None, rest)
    };
    if rest.is_empty() {
        return Err(format!("{file}:{line}: command: missing"));
    }
    let (command, input) = split_percent(rest);
    if command.trim().is_empty() {
        return Err(format!(
            "{file}:{line}: command: nothing before the first unescaped '%' (write \\% for a \
             literal percent sign)"
        ));
    }
    Ok(Parsed::Entry {
        entry: Entry {
            line,
            text,
            cron,
            command,
            input,
        },
        user,
    })
}

/// The command before the first unescaped `%`, and the input lines after it (each further `%`
/// a line break); `\%` is a literal `%` in both.
fn split_percent(text: &str) -> (String, Vec<String>) {
    let mut command = String::new();
    let mut input: Vec<String> = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let part = input.last_mut().unwrap_or(&mut command);
        match c {
            '\\' if chars.peek() == Some(&'%') => {
                chars.next();
                part.push('%');
            }
            '%' => input.push(String::new()),
            c => part.push(c),
        }
    }
    (command, input)
}

/// Words that start or wrap the program rather than name it; those marked take the next word as
/// their argument.
const WRAPPERS: &[(&str, bool)] = &[
    ("cd", true),
    ("sudo", false),
    ("nice", false),
    ("ionice", false),
    ("nohup", false),
    ("exec", false),
    ("env", false),
    ("time", false),
    ("timeout", true),
    ("flock", true),
    ("chronic", false),
    ("sh", false),
    ("bash", false),
    ("zsh", false),
    ("python", false),
    ("python2", false),
    ("python3", false),
    ("perl", false),
    ("ruby", false),
    ("php", false),
    ("node", false),
    ("java", false),
    ("test", false),
    ("[", false),
];

const OPERATORS: &[&str] = &["&&", "||", ";", "|", "&", "(", ")", "{", "}", "]"];

/// A name for an entry's command: see the module's doc. Valid as a workflow and task name.
pub fn derive_name(command: &str) -> String {
    let mut picked: Vec<String> = Vec::new();
    let mut skip_next = false;
    for word in command.split_whitespace() {
        if picked.len() == 2 {
            break;
        }
        if skip_next {
            // A wrapper's options come before its argument (`flock -n FILE`).
            skip_next = word.starts_with('-');
            continue;
        }
        if OPERATORS.contains(&word) {
            continue;
        }
        // Redirections: `>file`, `2>&1`, and `>`/`>>`/`<` followed by their file.
        let bare = word.trim_start_matches(|c: char| c.is_ascii_digit() || c == '&');
        if bare.starts_with('>') || bare.starts_with('<') {
            skip_next = bare.trim_start_matches(['>', '<', '&']).is_empty();
            continue;
        }
        if word.starts_with('-')
            || word.bytes().all(|b| b.is_ascii_digit())
            || setting(word).is_some()
        {
            continue;
        }
        let base = word
            .trim_matches(['"', '\'', ';', '`', '(', ')'])
            .rsplit('/')
            .next()
            .unwrap_or_default();
        if picked.is_empty()
            && let Some(&(_, takes_argument)) = WRAPPERS.iter().find(|(name, _)| *name == base)
        {
            skip_next = takes_argument;
            continue;
        }
        let stem = match base.rsplit_once('.') {
            Some((stem, ext)) if !stem.is_empty() && ext.len() <= 4 => stem,
            _ => base,
        };
        let slug = slug(stem);
        if !slug.is_empty() {
            picked.push(slug);
        }
    }
    let mut name = picked.join("-");
    name.truncate(40);
    let name = name.trim_end_matches(['-', '_', '.']).to_string();
    if name.is_empty() { "cron".into() } else { name }
}

/// Lower-case letters, digits and `_`, anything else a `-`, runs of `-` folded, no `-` at the
/// ends; starts with a letter or digit.
fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars().flat_map(char::to_lowercase) {
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' {
            c
        } else {
            '-'
        };
        if c == '-' && (out.is_empty() || out.ends_with('-')) {
            continue;
        }
        out.push(c);
    }
    out.trim_start_matches('_')
        .trim_end_matches(['-', '_'])
        .to_string()
}

fn unique_name(prefix: &str, base: &str, taken: &mut BTreeSet<String>) -> String {
    let first = format!("{prefix}{base}");
    let mut name = first.clone();
    let mut n = 2;
    while taken.contains(&name) || !is_valid_name(&name) {
        let suffix = format!("-{n}");
        let mut stem = first.clone();
        stem.truncate(64 - suffix.len());
        name = format!("{stem}{suffix}");
        n += 1;
    }
    taken.insert(name.clone());
    name
}

/// `text` as a YAML double-quoted scalar: every character that YAML or a terminal could read
/// otherwise escaped.
pub fn yaml_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() || matches!(c as u32, 0xfeff | 0x2028 | 0x2029) => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `text`, or `text` with its control characters escaped (for messages and comments).
fn printable(text: &str) -> String {
    if text.chars().any(char::is_control) {
        text.escape_default().to_string()
    } else {
        text.to_string()
    }
}

/// A shell word that is `text` exactly: single-quoted, each `'` as `'\''`.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

fn render(
    entry: &Entry<'_>,
    name: &str,
    task: &str,
    settings: &Settings,
    options: &ImportOptions,
) -> String {
    let mut y = String::new();
    y.push_str(&format!(
        "# Imported by `axctl import crontab` from {} line {}:\n#   {}\n",
        printable(&options.file),
        entry.line,
        printable(entry.text)
    ));
    y.push_str(&format!("name: {name}\n"));
    if let Some(app) = &options.app {
        y.push_str(&format!("app: {app}\n"));
    }
    y.push_str("schedule:\n");
    y.push_str(&format!("  cron: {}\n", yaml_quote(&entry.cron)));
    if let Some(zone) = &settings.zone {
        y.push_str(&format!("  timezone: {}\n", yaml_quote(zone)));
    }
    y.push_str(
        "  # cron runs no slot it missed while down; fire_once would run the latest one once\n",
    );
    y.push_str("  misfire: skip\n");
    y.push_str("tasks:\n");
    y.push_str(&format!("  - name: {task}\n"));
    let mut command = entry.command.trim_end().to_string();
    if !entry.input.is_empty() {
        // Cron sends the text after the first `%` to the command's standard input.
        let lines: Vec<String> = entry.input.iter().map(|l| shell_quote(l)).collect();
        command = format!("printf '%s\\n' {} | (\n{command}\n)", lines.join(" "));
    }
    match &settings.shell {
        Some(shell) => y.push_str(&format!(
            "    argv: [{}, \"-c\", {}]\n",
            yaml_quote(shell),
            yaml_quote(&command)
        )),
        None => y.push_str(&format!("    command: {}\n", yaml_quote(&command))),
    }
    if !settings.env.is_empty() {
        y.push_str("    env:\n");
        for (key, value) in &settings.env {
            y.push_str(&format!("      {key}: {}\n", yaml_quote(value)));
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse_workflow;

    fn options() -> ImportOptions {
        ImportOptions {
            file: "crontab".into(),
            timezone: Some("UTC".into()),
            ..ImportOptions::default()
        }
    }

    fn import(text: &str) -> Imported {
        import_crontab(text, &options()).unwrap_or_else(|errors| panic!("{errors:?}"))
    }

    /// The one workflow `text` makes, parsed back as ax parses files.
    fn one(text: &str) -> crate::spec::WorkflowSpec {
        let imported = import(text);
        assert_eq!(imported.workflows.len(), 1, "{imported:?}");
        let parsed = parse_workflow(&imported.workflows[0].yaml, "out.yaml")
            .unwrap_or_else(|err| panic!("{err}\n{}", imported.workflows[0].yaml));
        parsed.spec
    }

    #[test]
    fn entries_become_schedules_commands_and_zones() {
        // (crontab, cron, zone, command)
        let cases = [
            (
                "0 2 * * * /usr/local/bin/backup.sh --full",
                "0 2 * * *",
                "UTC",
                "/usr/local/bin/backup.sh --full",
            ),
            ("@hourly php artisan", "0 * * * *", "UTC", "php artisan"),
            ("@daily x", "0 0 * * *", "UTC", "x"),
            ("@midnight x", "0 0 * * *", "UTC", "x"),
            ("@weekly x", "0 0 * * 0", "UTC", "x"),
            ("@monthly x", "0 0 1 * *", "UTC", "x"),
            ("@yearly x", "0 0 1 1 *", "UTC", "x"),
            ("@ANNUALLY x", "0 0 1 1 *", "UTC", "x"),
            (
                "CRON_TZ=Asia/Shanghai\n*/5  9-17 * * MON-FRI  echo  'a  b'",
                "*/5 9-17 * * MON-FRI",
                "Asia/Shanghai",
                "echo  'a  b'",
            ),
            (
                "TZ = Europe/Paris\n0 0 1,15 * 7 x",
                "0 0 1,15 * 7",
                "Europe/Paris",
                "x",
            ),
            (
                r"0 0 * * * date +\%Y-\%m-\%d",
                "0 0 * * *",
                "UTC",
                "date +%Y-%m-%d",
            ),
        ];
        for (text, cron, zone, command) in cases {
            let spec = one(text);
            assert_eq!(spec.schedule.cron.as_deref(), Some(cron), "{text}");
            assert_eq!(spec.schedule.timezone, zone, "{text}");
            assert_eq!(spec.tasks[0].command, command, "{text}");
            assert_eq!(spec.schedule.misfire.name(), "skip", "{text}");
        }
    }

    #[test]
    fn settings_apply_to_the_entries_after_them() {
        let text = "\
# nightly jobs
PATH=/usr/local/bin:/usr/bin:/bin
GREETING = \"  hello  \"
0 1 * * * first
CRON_TZ=Asia/Tokyo
TZ=Europe/Berlin
PATH=/opt/bin
0 2 * * * second
";
        let imported = import(text);
        let specs: Vec<_> = imported
            .workflows
            .iter()
            .map(|w| parse_workflow(&w.yaml, "x.yaml").unwrap().spec)
            .collect();
        let env = |i: usize| -> Vec<(String, String)> {
            specs[i].tasks[0]
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        assert_eq!(
            env(0),
            [
                ("GREETING".to_string(), "  hello  ".to_string()),
                ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())
            ]
        );
        assert_eq!(specs[0].schedule.timezone, "UTC");
        assert_eq!(
            env(1),
            [
                ("GREETING".to_string(), "  hello  ".to_string()),
                ("PATH".into(), "/opt/bin".into()),
                ("TZ".into(), "Europe/Berlin".into())
            ]
        );
        assert_eq!(specs[1].schedule.timezone, "Europe/Berlin");
        assert_eq!(
            imported
                .workflows
                .iter()
                .map(|w| w.line)
                .collect::<Vec<_>>(),
            [4, 8]
        );
    }

    #[test]
    fn what_has_no_equivalent_is_warned_about_with_its_line() {
        let text = "MAILTO=ops@example.com\n@reboot /srv/start.sh\nRANDOM_DELAY=5\n0 3 * * * x\n";
        let imported = import(text);
        assert_eq!(imported.workflows.len(), 1);
        assert_eq!(imported.warnings.len(), 3, "{:?}", imported.warnings);
        assert!(imported.warnings[0].starts_with("crontab:1: MAILTO: ax sends no mail"));
        assert_eq!(
            imported.warnings[1],
            "crontab:2: @reboot: ax has no start-up trigger; the entry is not imported: \
             @reboot /srv/start.sh"
        );
        assert!(imported.warnings[2].starts_with("crontab:3: RANDOM_DELAY:"));

        // Without a zone, the schedules are read in UTC: said once.
        let imported = import_crontab(
            "0 1 * * * a\n0 2 * * * b\n",
            &ImportOptions {
                file: "crontab".into(),
                ..ImportOptions::default()
            },
        )
        .unwrap();
        assert_eq!(imported.warnings.len(), 1, "{:?}", imported.warnings);
        assert!(imported.warnings[0].starts_with("crontab:1: timezone: no CRON_TZ= or TZ="));
    }

    #[test]
    fn bad_lines_are_all_reported_with_their_line_and_nothing_is_made() {
        let text = "\
0 2 * * * good
0 2 * * bad-field-count
61 * * * * x
CRON_TZ=Mars/Olympus
@fortnightly x
0 0 30 2 * never
% * * * * x
0 2 * * * %only input
";
        let errors = import_crontab(text, &options()).unwrap_err();
        let located: Vec<&str> = errors
            .iter()
            .map(|e| e.split(": ").next().unwrap())
            .collect();
        assert_eq!(
            located,
            [
                "crontab:2",
                "crontab:3",
                "crontab:4",
                "crontab:5",
                "crontab:6",
                "crontab:7",
                "crontab:8"
            ],
            "{errors:#?}"
        );
        assert!(
            errors[0].contains("entry: expected five time fields"),
            "{}",
            errors[0]
        );
        assert!(
            errors[1].starts_with("crontab:3: schedule: "),
            "{}",
            errors[1]
        );
        assert!(errors[2].contains("CRON_TZ: unknown time zone \"Mars/Olympus\""));
        assert!(errors[3].contains("unknown macro \"@fortnightly\""));
        assert!(errors[4].contains("never fires"), "{}", errors[4]);
        assert!(errors[6].contains("command: nothing before the first unescaped '%'"));
    }

    #[test]
    fn names_come_from_the_command_and_are_unique_and_valid() {
        let cases = [
            (
                "/usr/local/bin/backup.sh --full > /var/log/b.log 2>&1",
                "backup",
            ),
            ("php /var/www/artisan schedule:run", "artisan-schedule-run"),
            ("cd /srv/app && ./report.sh >/dev/null", "report"),
            ("python3 /opt/etl/sync.py orders", "sync-orders"),
            ("FOO=1 nice -n 10 /bin/Clean_Up.PL", "clean_up"),
            ("flock -n /tmp/lock /usr/bin/rsync -a src dst", "rsync-src"),
            ("/usr/bin/ÉTÉ.sh", "t"),
            ("> /dev/null", "cron"),
            ("'/opt/my tool/run' now", "my-run"),
            ("timeout 5m /srv/job", "job"),
        ];
        for (command, name) in cases {
            let derived = derive_name(command);
            assert_eq!(derived, name, "{command}");
            assert!(is_valid_name(&derived), "{derived}");
        }
        let imported = import_crontab(
            "0 1 * * * backup.sh\n0 2 * * * backup.sh\n0 3 * * * /x/backup.sh\n",
            &ImportOptions {
                prefix: "web1-".into(),
                app: Some("ops".into()),
                ..options()
            },
        )
        .unwrap();
        let names: Vec<&str> = imported.workflows.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["web1-backup", "web1-backup-2", "web1-backup-3"]);
        let spec = parse_workflow(&imported.workflows[1].yaml, "x.yaml")
            .unwrap()
            .spec;
        assert_eq!(
            (spec.app.as_str(), spec.tasks[0].name.as_str()),
            ("ops", "backup")
        );
        let long = format!("0 1 * * * {}\n0 2 * * * {0}\n", "a".repeat(80));
        let imported = import_crontab(
            &long,
            &ImportOptions {
                prefix: "p".repeat(30),
                ..options()
            },
        )
        .unwrap();
        for workflow in &imported.workflows {
            assert!(is_valid_name(&workflow.name), "{}", workflow.name);
        }
        assert_ne!(imported.workflows[0].name, imported.workflows[1].name);
    }

    #[test]
    fn shells_input_and_system_crontabs_translate() {
        let spec = one("SHELL=/bin/bash\n0 * * * * echo $((1+1)) # sum\n");
        assert!(spec.tasks[0].command.is_empty());
        assert_eq!(
            spec.tasks[0].argv,
            ["/bin/bash", "-c", "echo $((1+1)) # sum"]
        );
        let spec = one("SHELL=/bin/sh\n0 * * * * echo hi\n");
        assert_eq!(spec.tasks[0].command, "echo hi");

        let spec = one("0 * * * * mail -s hi ops%it's done%bye # x\n");
        assert_eq!(
            spec.tasks[0].command,
            "printf '%s\\n' 'it'\\''s done' 'bye # x' | (\nmail -s hi ops\n)"
        );

        let imported = import_crontab(
            "0 4 * * * root /usr/sbin/logrotate /etc/logrotate.conf\n\
             @daily www-data php cron.php\n0 5 * * * root sync\n",
            &ImportOptions {
                system: true,
                ..options()
            },
        )
        .unwrap();
        let commands: Vec<String> = imported
            .workflows
            .iter()
            .map(|w| {
                parse_workflow(&w.yaml, "x.yaml").unwrap().spec.tasks[0]
                    .command
                    .clone()
            })
            .collect();
        assert_eq!(
            commands,
            [
                "/usr/sbin/logrotate /etc/logrotate.conf",
                "php cron.php",
                "sync"
            ]
        );
        let users: Vec<&String> = imported.warnings.iter().collect();
        assert_eq!(users.len(), 2, "one warning per user: {users:?}");
        assert!(users[0].starts_with("crontab:1: user:"));
        assert!(users[1].starts_with("crontab:2: user:") && users[1].contains("www-data"));
    }

    #[test]
    fn any_command_text_survives_the_yaml() {
        let texts = [
            "echo \"quoted\" 'single' \\back\\slash",
            "echo: colon: {braces} [brackets] #hash &amp *star !bang |pipe >gt",
            "echo tab\there and unicode ✓",
            "- dash start",
            "yes",
            "~",
        ];
        for text in texts {
            let spec = one(&format!("0 0 * * * {text}\n"));
            assert_eq!(spec.tasks[0].command, text);
        }
    }
}
