//! Takes an attempt's whole process group down with the worker, grandchildren included.
//!
//! The parent-death signal set on each task process reaches only that direct child: a task's
//! own children (`sleep 300 &`, a pipeline, a training script's data loaders) would outlive a
//! `kill -9` of the worker and run beside the retry the scheduler starts elsewhere. So the worker
//! keeps one small guardian process, `awk` reading the process groups of live attempts from a
//! pipe. When the worker dies, however it dies, the kernel closes the pipe; awk sees end of file
//! and sends SIGKILL to every group still listed. Groups are struck off when their attempt ends,
//! so a recycled group id is never hit.

use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;

/// On `+PGID` remember the group, on `-PGID` forget it, at end of input kill what is left.
const SCRIPT: &str = r#"
/^\+[0-9]+$/ { live[substr($0, 2)] = 1; next }
/^-[0-9]+$/  { delete live[substr($0, 2)]; next }
END { for (group in live) system("kill -KILL -" group " 2>/dev/null") }
"#;

#[derive(Debug)]
pub struct Guardian {
    pipe: Mutex<Option<ChildStdin>>,
    child: Mutex<Child>,
}

impl Guardian {
    /// Starts the guardian in a process group of its own (so no attempt's group kill reaches
    /// it). Fails when `awk` cannot be started; the worker then runs without it and says so.
    pub fn start() -> std::io::Result<Guardian> {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new("awk")
            .arg(SCRIPT)
            // Tasks read /proc of their fellow processes: the guardian holds no credential.
            .env_remove("AX_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let pipe = child.stdin.take();
        Ok(Guardian {
            pipe: Mutex::new(pipe),
            child: Mutex::new(child),
        })
    }

    /// The attempt whose process leads `pgid` started.
    pub fn watch(&self, pgid: i32) {
        self.tell(&format!("+{pgid}\n"));
    }

    /// The attempt whose process led `pgid` ended and its group was reaped.
    pub fn unwatch(&self, pgid: i32) {
        self.tell(&format!("-{pgid}\n"));
    }

    fn tell(&self, line: &str) {
        if line.len() <= 2 {
            return;
        }
        let mut pipe = self
            .pipe
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(writer) = pipe.as_mut() else { return };
        // A few bytes into a pipe the guardian drains continuously: this does not block.
        if let Err(error) = writer
            .write_all(line.as_bytes())
            .and_then(|()| writer.flush())
        {
            tracing::warn!(%error, "the process-group guardian is gone; grandchildren may outlive a crash");
            *pipe = None;
        }
    }
}

impl Drop for Guardian {
    fn drop(&mut self) {
        // Closing the pipe ends the guardian (killing any group still listed, normally none).
        if let Ok(mut pipe) = self.pipe.lock() {
            pipe.take();
        }
        if let Ok(mut child) = self.child.lock() {
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn alive(pid: i32) -> bool {
        // SAFETY: signal 0 only checks that the process exists.
        unsafe { libc::kill(pid, 0) == 0 }
    }

    fn spawn_group(command: &str) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        Command::new("/bin/sh")
            .args(["-c", command])
            .process_group(0)
            .spawn()
            .expect("spawn")
    }

    fn wait_dead(pid: i32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !alive(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[test]
    fn closing_the_pipe_kills_listed_groups_with_their_grandchildren_and_spares_the_rest() {
        let dir = tempfile::tempdir().expect("dir");
        let pid_file = dir.path().join("grandchild");
        let mut listed = spawn_group(&format!(
            "sleep 300 & echo $! > {}; wait",
            pid_file.display()
        ));
        let mut struck_off = spawn_group("sleep 300");
        let guardian = Guardian::start().expect("awk is installed");
        guardian.watch(listed.id() as i32);
        guardian.watch(struck_off.id() as i32);
        guardian.unwatch(struck_off.id() as i32);
        let grandchild: i32 = loop {
            if let Some(pid) = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|t| t.trim().parse().ok())
            {
                break pid;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(alive(grandchild));
        drop(guardian);
        let _ = listed.wait();
        assert!(
            wait_dead(grandchild),
            "the grandchild of a listed group survived"
        );
        assert!(
            alive(struck_off.id() as i32),
            "a group struck off the list was killed"
        );
        let _ = struck_off.kill();
        let _ = struck_off.wait();
    }
}
