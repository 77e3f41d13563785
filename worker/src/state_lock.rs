//! One worker process per state directory.
//!
//! The state directory holds one worker's ends journal, spill files and held attempts. Two
//! processes on it would both replay the journal, both adopt the same held attempts and report
//! each end twice, so the second is refused at start, naming the first. The lock is an
//! `flock` on `<state-dir>/lock`: the kernel drops it when its process dies, kill -9 included,
//! so a crash never leaves a stale lock; the file is opened close-on-exec, so neither tasks nor
//! holders inherit it and a held attempt never keeps its worker's successor out.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a starting worker waits for a predecessor that is still exiting (a restart right
/// after a kill) before it refuses.
pub(crate) const WAIT_FOR_PREDECESSOR: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum StateLockError {
    #[error(
        "the state directory {dir} is in use by another worker process ({holder}); \
         give each worker process its own --state-dir"
    )]
    InUse { dir: PathBuf, holder: String },
    #[error("cannot lock the state directory {dir}: {source}")]
    Io {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The lock on a state directory, held while this value lives.
#[derive(Debug)]
pub(crate) struct StateLock {
    _file: File,
}

impl StateLock {
    /// Takes the lock of `dir` (creating both), waiting up to `patience` for a holder that is
    /// exiting.
    pub(crate) fn take(dir: &Path, patience: Duration) -> Result<StateLock, StateLockError> {
        let io = |source| StateLockError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join("lock"))
            .map_err(io)?;
        let deadline = Instant::now() + patience;
        loop {
            // SAFETY: flock on a descriptor this function owns; no memory is involved.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io(error));
            }
            if Instant::now() >= deadline {
                return Err(StateLockError::InUse {
                    dir: dir.to_path_buf(),
                    holder: holder(&mut file),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The holder's pid, for the refusal a second process would get.
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        write!(file, "pid {}", std::process::id()).map_err(io)?;
        Ok(StateLock { _file: file })
    }
}

fn holder(file: &mut File) -> String {
    let mut text = String::new();
    let read = file.rewind().and_then(|()| file.read_to_string(&mut text));
    match read {
        Ok(_) if !text.trim().is_empty() => text.trim().to_string(),
        _ => "pid unknown".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_naming_the_first_and_the_lock_frees_on_drop() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let first = StateLock::take(&state, Duration::ZERO).expect("the first takes it");
        match StateLock::take(&state, Duration::from_millis(120)) {
            Err(StateLockError::InUse { holder, .. }) => {
                assert_eq!(holder, format!("pid {}", std::process::id()));
            }
            other => panic!("a second holder got {other:?}"),
        }
        drop(first);
        StateLock::take(&state, Duration::ZERO).expect("free once the first is gone");
    }
}
