//! When a task's command line needs no shell.
//!
//! A task's `command` is a shell command line, run as `/bin/sh -c command`. Most are one program
//! with literal arguments (`python3 etl.py --day 2024-05-01`, `sleep 0.05`), for which the shell
//! only splits the words, looks the program up on `PATH` and executes it in its own place: the
//! shell's own start (loading and initialising it) is pure cost, about as much as the task's
//! when the task is short. Such a line is started directly instead, the same program with the
//! same words, environment and exit status. Anything the shell would interpret (quotes,
//! variables, globs, redirections, operators, comments, a leading assignment, a builtin or a
//! keyword) keeps the shell.

/// Shell builtins and reserved words, of dash and of bash: a line starting with one of them
/// means what the shell makes of it, not a program on `PATH` (`echo` differs, `exit 3` is not
/// a program at all, `time` times the line).
const SHELL_WORDS: &[&str] = &[
    "!",
    ".",
    ":",
    "[",
    "[[",
    "]]",
    "{",
    "}",
    "alias",
    "bg",
    "bind",
    "break",
    "builtin",
    "caller",
    "case",
    "cd",
    "chdir",
    "command",
    "compgen",
    "complete",
    "coproc",
    "declare",
    "dirs",
    "disown",
    "do",
    "done",
    "echo",
    "elif",
    "else",
    "enable",
    "esac",
    "eval",
    "exec",
    "exit",
    "export",
    "false",
    "fc",
    "fg",
    "fi",
    "for",
    "function",
    "getopts",
    "hash",
    "help",
    "history",
    "if",
    "in",
    "jobs",
    "kill",
    "let",
    "local",
    "logout",
    "mapfile",
    "popd",
    "printf",
    "pushd",
    "pwd",
    "read",
    "readarray",
    "readonly",
    "return",
    "select",
    "set",
    "shift",
    "shopt",
    "source",
    "suspend",
    "test",
    "then",
    "time",
    "times",
    "trap",
    "true",
    "type",
    "typeset",
    "ulimit",
    "umask",
    "unalias",
    "unset",
    "until",
    "wait",
    "while",
];

/// Bytes that mean only themselves to the shell, outside quotes.
fn literal(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"_-./:,+=@%".contains(&byte)
}

/// The words of `command` when the shell would run it as one external program with these
/// literal words; `None` when only a shell can run it as written.
pub fn plain_words(command: &str) -> Option<Vec<&str>> {
    if !command
        .bytes()
        .all(|byte| literal(byte) || byte == b' ' || byte == b'\t')
    {
        return None;
    }
    let words: Vec<&str> = command
        .split([' ', '\t'])
        .filter(|w| !w.is_empty())
        .collect();
    let program = words.first()?;
    // `NAME=value cmd` sets a variable for the command: the shell's to do.
    if program.contains('=') || SHELL_WORDS.contains(program) {
        return None;
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_program_with_literal_words_needs_no_shell() {
        assert_eq!(plain_words("sleep 0.05"), Some(vec!["sleep", "0.05"]));
        assert_eq!(
            plain_words("  python3 /opt/etl/load.py --day=2024-05-01\t-v "),
            Some(vec![
                "python3",
                "/opt/etl/load.py",
                "--day=2024-05-01",
                "-v"
            ])
        );
        assert_eq!(
            plain_words("./run.sh a,b user@host 50%"),
            Some(vec!["./run.sh", "a,b", "user@host", "50%"])
        );
    }

    #[test]
    fn anything_the_shell_interprets_keeps_the_shell() {
        for command in [
            "",
            "   ",
            "echo hello",
            "exit 3",
            "true",
            "time sleep 1",
            "cd /tmp",
            "FOO=1 env",
            "sleep 1; echo done",
            "sleep 1 && echo done",
            "cat a | wc -l",
            "ls > out",
            "echo $HOME",
            "ls *.csv",
            "ls file?.txt",
            "echo 'quoted'",
            "echo \"quoted\"",
            "a\\ b",
            "ls ~",
            "run # comment",
            "run\nother",
            "run `date`",
            "(run)",
            "{ run; }",
            "run &",
            "caf\u{e9}",
        ] {
            assert_eq!(plain_words(command), None, "{command:?}");
        }
    }
}
