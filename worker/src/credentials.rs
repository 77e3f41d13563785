//! The worker's token, kept from its tasks.
//!
//! A task runs as the worker's user unless `--task-user` says otherwise, and a process of that
//! user reads `/proc/<worker pid>/environ`: the environment block the kernel laid out when the
//! worker was executed, which `unsetenv` does not touch (it only drops the C library's pointer
//! to the entry). Any user on the host reads `/proc/<worker pid>/cmdline`. So the binary, first
//! thing in `main` and before any other thread exists, reads `AX_TOKEN`, drops it from the
//! environment and overwrites its bytes in that block with NULs, and overwrites the value of a
//! `--token` argument the same way once the flags are parsed. Tasks get an environment without
//! `AX_TOKEN` and `AX_TOKEN_FILE` in any case (`spawn.rs`). A token file (`--token-file`) is
//! better still: the token is then never in the worker's environment or arguments, and the file's
//! mode decides who reads it.

use std::ffi::CStr;

/// The token's variable.
const TOKEN_VARIABLE: &[u8] = b"AX_TOKEN";

/// Takes `AX_TOKEN` out of the process: answers its value (the first, were it given twice),
/// removes it from the environment and overwrites every `AX_TOKEN=…` entry of the exec-time
/// environment block with NULs.
///
/// # Safety
/// No other thread may run: the environment is read and written without the standard
/// library's lock, and the C library's `environ` array is changed.
pub unsafe fn take_environment_token() -> Option<String> {
    let mut value = None;
    let mut entries: Vec<(*mut libc::c_char, usize)> = Vec::new();
    // SAFETY: `environ` is the C library's NULL-terminated array of NUL-terminated entries; no
    // other thread changes it (the caller's promise).
    unsafe {
        let mut cursor = libc::environ;
        while !cursor.is_null() && !(*cursor).is_null() {
            let entry = *cursor;
            let bytes = CStr::from_ptr(entry).to_bytes();
            if bytes.len() > TOKEN_VARIABLE.len()
                && bytes.starts_with(TOKEN_VARIABLE)
                && bytes[TOKEN_VARIABLE.len()] == b'='
            {
                if value.is_none() {
                    let text = &bytes[TOKEN_VARIABLE.len() + 1..];
                    value = Some(String::from_utf8_lossy(text).into_owned());
                }
                entries.push((entry, bytes.len()));
            }
            cursor = cursor.add(1);
        }
        // Out of the C library's array first (it compares names, which the NULs would hide).
        std::env::remove_var("AX_TOKEN");
        for (entry, len) in entries {
            std::ptr::write_bytes(entry, 0, len);
        }
    }
    value
}

/// Overwrites with NULs the value of every `--token VALUE` and `--token=VALUE` in the
/// exec-time argument block `/proc/self/cmdline` shows. Answers false when the block cannot be
/// found (no `/proc`): the caller says so once logging is up.
///
/// # Safety
/// No other thread may read the process's arguments meanwhile; the standard library's copy of
/// them (`std::env::args`) must already have been taken (the flags parsed).
pub unsafe fn scrub_token_argument() -> bool {
    let Some((start, end)) = argument_block() else {
        return false;
    };
    // SAFETY: [start, end) is this process's own argument block, laid out by the kernel on its
    // stack and never freed; nothing else reads it now (the caller's promise).
    let block = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, end - start) };
    scrub_token_values(block);
    true
}

/// In a block of NUL-terminated arguments, overwrites the token values with NULs.
fn scrub_token_values(block: &mut [u8]) {
    let mut starts = vec![0];
    for (at, &byte) in block.iter().enumerate() {
        if byte == 0 && at + 1 < block.len() {
            starts.push(at + 1);
        }
    }
    let arg_end = |start: usize, block: &[u8]| {
        block[start..]
            .iter()
            .position(|&byte| byte == 0)
            .map_or(block.len(), |at| start + at)
    };
    let mut previous_was_flag = false;
    for &start in &starts {
        let end = arg_end(start, block);
        let arg = &block[start..end];
        if previous_was_flag {
            block[start..end].fill(0);
            previous_was_flag = false;
            continue;
        }
        if arg == b"--token" {
            previous_was_flag = true;
        } else if arg.starts_with(b"--token=") {
            block[start + b"--token=".len()..end].fill(0);
        } else if arg == b"--" {
            break;
        }
    }
}

/// The `arg_start` and `arg_end` fields of `/proc/self/stat` (fields 48 and 49).
fn argument_block() -> Option<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces and parentheses itself.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // `fields[0]` is field 3.
    let start: usize = fields.get(48 - 3)?.parse().ok()?;
    let end: usize = fields.get(49 - 3)?.parse().ok()?;
    (start != 0 && end > start).then_some((start, end))
}

/// Makes this process undumpable: its `/proc/<pid>/` files (environ, mem, maps) become root's,
/// and no process of the same user (a task, when tasks run as the worker's user) may attach to
/// it or read its memory, where the token lives. A core dump is not written either.
pub fn forbid_inspection() {
    // SAFETY: prctl with PR_SET_DUMPABLE takes a plain integer and touches no memory of ours.
    let result = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if result != 0 {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            "cannot make the worker undumpable: tasks of its user may read its memory"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_values_are_overwritten_and_nothing_else() {
        let mut block = b"ax-worker\0--token\0axt_secret\0--id\0w1\0--token=axt_other\0".to_vec();
        scrub_token_values(&mut block);
        let text = String::from_utf8_lossy(&block).replace('\0', "|");
        let blank = |len: usize| "|".repeat(len);
        assert_eq!(
            text,
            format!(
                "ax-worker|--token|{}|--id|w1|--token={}|",
                blank("axt_secret".len()),
                blank("axt_other".len())
            )
        );
        // After `--`, arguments are not flags.
        let mut block = b"x\0--\0--token\0keep\0".to_vec();
        scrub_token_values(&mut block);
        assert_eq!(block, b"x\0--\0--token\0keep\0");
    }

    #[test]
    fn this_process_finds_its_argument_block() {
        let (start, end) = argument_block().expect("the block");
        let cmdline = std::fs::read("/proc/self/cmdline").expect("cmdline");
        assert_eq!(end - start, cmdline.len());
    }
}
