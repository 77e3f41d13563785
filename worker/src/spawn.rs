//! Starts an attempt's process without copying the worker's page tables.
//!
//! The task must die with the worker, even on `kill -9`, so the child sets its parent-death
//! signal before `exec`. With `std::process::Command` that takes a `pre_exec` hook, and a hook
//! makes std `fork` instead of `posix_spawn`: the kernel then copies the page tables of the
//! whole worker (its retained log batches, its runtime) for each task, and that copy was more
//! than half of the worker's CPU at a thousand starts a second. So the worker starts tasks the
//! way `posix_spawn` does: `clone(CLONE_VM | CLONE_VFORK)` runs the child on a small stack of
//! its own in the worker's memory, the calling thread waits until the child has called `exec`
//! (or failed), and the child makes only system calls in between: no allocation, no lock.
//!
//! Between `clone` and `exec` the child:
//! - sets every signal the worker handles back to its default, and SIGPIPE too (Rust ignores it;
//!   a task's `yes | head` must end by it), then clears the signal mask;
//! - leads a process group of its own, so a kill reaches everything the task starts and a Ctrl-C
//!   at the worker's terminal does not reach the task directly;
//! - with `--task-user`, takes that account's groups, group id and user id (raw system calls:
//!   the C library's wrappers would signal the worker's threads to change theirs too);
//! - asks for SIGKILL when its parent thread dies (after the user change, which clears it), and
//!   checks that the worker has not already died;
//! - takes `/dev/null` as stdin and the two pipes as stdout and stderr;
//! - enters the working directory and calls `execve`.
//!
//! A failing step is written, with its errno, into memory the parent reads once `clone` returns.
//! The exit is awaited on a pidfd (Linux 5.3 or later).

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

/// The child's stack: it runs a handful of system calls in frames of a few hundred bytes.
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// The worker's own credentials: a task does not inherit them (a task that holds the worker's
/// token could open a worker stream of its own).
const WORKER_ONLY: [&str; 2] = ["AX_TOKEN", "AX_TOKEN_FILE"];

/// Where the path search starts when neither the task nor the worker sets `PATH`.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A program, its arguments and environment, ready to be started as an attempt's process.
#[derive(Debug)]
pub struct TaskCommand {
    program: OsString,
    args: Vec<OsString>,
    env: BTreeMap<OsString, OsString>,
    working_dir: Option<PathBuf>,
    /// The program's file, once looked up (`executes_directly`), so `spawn` does not search
    /// `PATH` again; forgotten when `PATH` changes.
    resolved: Option<PathBuf>,
    /// The account the process runs as; the worker's own when `None`.
    user: Option<Identity>,
    /// Starts a session of its own and outlives the worker (the holder of a held attempt).
    detached: bool,
}

/// A user id, its primary group and every group the process holds.
#[derive(Debug, Clone)]
struct Identity {
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
}

impl TaskCommand {
    /// A command that runs `program` with the worker's environment, but for its credentials.
    pub fn new(program: impl Into<OsString>) -> TaskCommand {
        TaskCommand {
            program: program.into(),
            args: Vec::new(),
            env: std::env::vars_os()
                .filter(|(key, _)| !WORKER_ONLY.iter().any(|name| key == name))
                .collect(),
            working_dir: None,
            resolved: None,
            user: None,
            detached: false,
        }
    }

    /// Makes the process outlive the worker: it leads a session of its own (no terminal's or
    /// process group's signal reaches it) and gets no parent-death signal. Only the holder of a
    /// held attempt is started so; it fences itself (see `held`).
    pub fn detach(&mut self) -> &mut TaskCommand {
        self.detached = true;
        self
    }

    /// Runs the process as the user `uid` with group `gid` and `groups` (the caller must be
    /// root); the environment is left as it is.
    pub fn run_as_ids(
        &mut self,
        uid: libc::uid_t,
        gid: libc::gid_t,
        groups: Vec<libc::gid_t>,
    ) -> &mut TaskCommand {
        self.user = Some(Identity { uid, gid, groups });
        self
    }

    /// Runs the process as `user` (the worker must be root), with `HOME`, `USER` and `LOGNAME`
    /// set for it.
    pub fn run_as(&mut self, user: &crate::task_user::TaskUser) -> &mut TaskCommand {
        self.user = Some(Identity {
            uid: user.uid,
            gid: user.gid,
            groups: user.groups.clone(),
        });
        self.env("HOME", &user.home)
            .env("USER", &user.name)
            .env("LOGNAME", &user.name)
    }

    pub fn arg(&mut self, arg: impl Into<OsString>) -> &mut TaskCommand {
        self.args.push(arg.into());
        self
    }

    pub fn env(
        &mut self,
        key: impl Into<OsString>,
        value: impl Into<OsString>,
    ) -> &mut TaskCommand {
        let key = key.into();
        if key == "PATH" {
            self.resolved = None;
        }
        self.env.insert(key, value.into());
        self
    }

    /// This command, run by `holder` (its own executable, given `arguments` first): the holder
    /// runs with this command's environment and working directory, and starts the program with
    /// its arguments itself (see `held::holder`). The holder runs as the worker's account.
    pub fn held_by(self, holder: PathBuf, mut arguments: Vec<OsString>) -> TaskCommand {
        arguments.push(self.program);
        arguments.extend(self.args);
        TaskCommand {
            program: holder.into_os_string(),
            args: arguments,
            env: self.env,
            working_dir: self.working_dir,
            resolved: None,
            user: None,
            detached: false,
        }
    }

    /// The program as given (a name looked up on `PATH`, or a path).
    pub fn get_program(&self) -> &OsStr {
        &self.program
    }

    pub fn current_dir(&mut self, dir: impl Into<PathBuf>) -> &mut TaskCommand {
        self.working_dir = Some(dir.into());
        self
    }

    /// Starts the process. Must be called on a thread that lives as long as the worker: the
    /// parent-death signal follows the thread that started the child (tokio's runtime threads do;
    /// a blocking-pool thread that retires after idling would take its tasks with it).
    pub fn spawn(&self) -> io::Result<TaskProcess> {
        let prepared = self.prepare()?;
        let stdin = above_stdio(open_dev_null()?)?;
        let (stdout_read, stdout_write) = pipe_pair()?;
        let (stderr_read, stderr_write) = pipe_pair()?;
        let pid = start(
            &prepared,
            [
                stdin.as_raw_fd(),
                stdout_write.as_raw_fd(),
                stderr_write.as_raw_fd(),
            ],
        )?;
        // The child holds its own copies now.
        drop((stdin, stdout_write, stderr_write));
        let exit = match pidfd_open(pid) {
            Ok(fd) => fd,
            Err(error) => {
                kill_and_reap(pid);
                return Err(io::Error::new(
                    error.kind(),
                    format!("pidfd_open: {error} (the worker needs Linux 5.3 or later)"),
                ));
            }
        };
        // SAFETY: the AsyncFd owns the pidfd, which stays open and the same until it is dropped.
        let exit = unsafe { AsyncFd::register_with_interest(exit, Interest::READABLE) };
        let exit = match exit {
            Ok(exit) => exit,
            Err(error) => {
                kill_and_reap(pid);
                return Err(error.into());
            }
        };
        // From here on, dropping `process` reaps the child.
        let mut process = TaskProcess {
            pid: pid.cast_unsigned(),
            exit: Some(exit),
            status: None,
            stdout: None,
            stderr: None,
        };
        process.stdout = Some(pipe::Receiver::from_owned_fd(stdout_read)?);
        process.stderr = Some(pipe::Receiver::from_owned_fd(stderr_read)?);
        Ok(process)
    }

    /// Everything the child needs, as C strings, built before the `clone`.
    fn prepare(&self) -> io::Result<Prepared> {
        let program_path = match &self.resolved {
            Some(path) => path.clone(),
            None => self.resolve_program()?,
        };
        let path = c_string(program_path.as_os_str(), "the program")?;
        let mut argv = Vec::with_capacity(self.args.len() + 1);
        argv.push(c_string(&self.program, "the program")?);
        for arg in &self.args {
            argv.push(c_string(arg, "an argument")?);
        }
        let mut envp = Vec::with_capacity(self.env.len());
        for (key, value) in &self.env {
            if key.is_empty() || key.as_bytes().contains(&b'=') {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "environment variable name {:?} is empty or contains '='",
                        key.to_string_lossy()
                    ),
                ));
            }
            let mut entry = key.clone();
            entry.push("=");
            entry.push(value);
            envp.push(c_string(&entry, "an environment variable")?);
        }
        let working_dir = match &self.working_dir {
            Some(dir) => Some(c_string(dir.as_os_str(), "the working directory")?),
            None => None,
        };
        Ok(Prepared {
            path,
            argv,
            envp,
            working_dir,
            user: self.user.clone(),
            detached: self.detached,
        })
    }

    /// Whether `execve` can start the program as it is: it is found (see `resolve_program`) and
    /// is a binary or a script with a `#!` line. A script without one is run by a shell, and
    /// only a shell does that (`execve` refuses it with `ENOEXEC`).
    pub fn executes_directly(&mut self) -> bool {
        let Ok(found) = self.resolve_program() else {
            return false;
        };
        self.resolved = Some(found.clone());
        let mut path = found;
        // A relative path is executed from the working directory.
        if let Some(dir) = &self.working_dir
            && path.is_relative()
        {
            path = dir.join(path);
        }
        let mut head = [0u8; 4];
        let read = std::fs::File::open(&path).and_then(|mut file| {
            use std::io::Read;
            file.read_exact(&mut head)
        });
        read.is_ok() && (head == *b"\x7fELF" || head.starts_with(b"#!"))
    }

    /// The file to execute: `program` itself when it names a path, otherwise the first
    /// executable file of that name on the task's `PATH` (the worker's when the task sets none).
    fn resolve_program(&self) -> io::Result<PathBuf> {
        if self.program.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the program name is empty",
            ));
        }
        if self.program.as_bytes().contains(&b'/') {
            return Ok(PathBuf::from(&self.program));
        }
        let search = self
            .env
            .get(OsStr::new("PATH"))
            .cloned()
            .unwrap_or_else(|| DEFAULT_PATH.into());
        for dir in std::env::split_paths(&search) {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".").to_path_buf()
            } else {
                dir
            };
            let candidate = dir.join(&self.program);
            if is_executable_file(&candidate) {
                return Ok(candidate);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "program {:?} not found on PATH {:?}",
                self.program.to_string_lossy(),
                search.to_string_lossy()
            ),
        ))
    }
}

/// A started attempt process: its pid, output pipes and exit.
#[derive(Debug)]
pub struct TaskProcess {
    pid: u32,
    /// The pidfd, readable once the process has exited; `None` once the process is reaped.
    exit: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
}

impl TaskProcess {
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// Reads stdout and stderr to their ends, then waits for the exit: the whole output, as
    /// `std::process::Command::output` gives it (for callers that do not stream the lines).
    pub async fn output(&mut self) -> io::Result<(Vec<u8>, Vec<u8>, ExitStatus)> {
        async fn read_all(pipe: Option<pipe::Receiver>) -> io::Result<Vec<u8>> {
            use tokio::io::AsyncReadExt;
            let mut out = Vec::new();
            if let Some(mut pipe) = pipe {
                pipe.read_to_end(&mut out).await?;
            }
            Ok(out)
        }
        let (stdout, stderr) =
            tokio::join!(read_all(self.stdout.take()), read_all(self.stderr.take()));
        let status = self.wait().await?;
        Ok((stdout?, stderr?, status))
    }

    /// Waits for the process to exit and reaps it. Cancel safe; once it has returned a status,
    /// returns that status again.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.status {
                return Ok(status);
            }
            let Some(exit) = &self.exit else {
                return Err(io::Error::other("the process was already reaped"));
            };
            let mut ready = exit.readable().await?;
            match reap(self.pid.cast_signed(), libc::WNOHANG)? {
                Some(status) => {
                    self.status = Some(status);
                    self.exit = None;
                }
                None => ready.clear_ready(),
            }
        }
    }
}

impl Drop for TaskProcess {
    /// A process dropped before it was seen to exit is reaped when it does, so it never stays
    /// a zombie for the worker's lifetime.
    fn drop(&mut self) {
        let Some(exit) = self.exit.take() else { return };
        let pid = self.pid.cast_signed();
        if matches!(reap(pid, libc::WNOHANG), Ok(Some(_)) | Err(_)) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if exit.readable().await.is_ok() {
                    let _ = reap(pid, libc::WNOHANG);
                }
            });
        }
    }
}

/// The C strings of one start, owned by the parent for the duration of the `clone`.
struct Prepared {
    path: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    working_dir: Option<CString>,
    user: Option<Identity>,
    detached: bool,
}

/// The step of the child's setup that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
enum Step {
    None = 0,
    ProcessGroup,
    User,
    DeathSignal,
    WorkerGone,
    Stdio,
    WorkingDir,
    Exec,
}

impl Step {
    fn from_code(code: i32) -> Step {
        [
            Step::None,
            Step::ProcessGroup,
            Step::User,
            Step::DeathSignal,
            Step::WorkerGone,
            Step::Stdio,
            Step::WorkingDir,
        ]
        .into_iter()
        .find(|step| *step as i32 == code)
        .unwrap_or(Step::Exec)
    }
}

/// What the parent hands the child, and the child's report back: the child runs in the
/// parent's memory, and the parent's thread is suspended until the child has called `exec` or
/// exited, so the child writes `failed_step` and `errno` here and the parent reads them after.
#[repr(C)]
struct ChildArgs {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    working_dir: *const libc::c_char,
    stdio: [RawFd; 3],
    /// Non-zero: switch to `uid`, `gid` and the `ngroups` groups at `groups`.
    switch_user: i32,
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: *const libc::gid_t,
    ngroups: usize,
    worker_pid: libc::pid_t,
    /// Non-zero: a new session instead of a process group, and no parent-death signal.
    detached: i32,
    failed_step: i32,
    errno: i32,
}

/// Clones the child and waits for it to `exec`. Returns its pid, or the step that failed.
fn start(prepared: &Prepared, stdio: [RawFd; 3]) -> io::Result<libc::pid_t> {
    let argv = null_terminated(&prepared.argv);
    let envp = null_terminated(&prepared.envp);
    let mut args = ChildArgs {
        path: prepared.path.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        working_dir: prepared
            .working_dir
            .as_ref()
            .map_or(std::ptr::null(), |dir| dir.as_ptr()),
        stdio,
        switch_user: i32::from(prepared.user.is_some()),
        uid: prepared.user.as_ref().map_or(0, |user| user.uid),
        gid: prepared.user.as_ref().map_or(0, |user| user.gid),
        groups: prepared
            .user
            .as_ref()
            .map_or(std::ptr::null(), |user| user.groups.as_ptr()),
        ngroups: prepared.user.as_ref().map_or(0, |user| user.groups.len()),
        // SAFETY: getpid has no preconditions.
        worker_pid: unsafe { libc::getpid() },
        detached: i32::from(prepared.detached),
        failed_step: Step::None as i32,
        errno: 0,
    };
    let mut stack = vec![0u8; CHILD_STACK_BYTES];
    // The stack grows down from its end, 16-byte aligned as the ABI requires.
    let top = {
        let end = stack.as_mut_ptr_range().end as usize;
        (end & !15) as *mut libc::c_void
    };
    // SAFETY: all-zero is a valid sigset_t, filled in by sigfillset below.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above; written by pthread_sigmask.
    let mut previous: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY:
    // - Signals are blocked on this thread for the clone, so no handler of the worker runs on
    //   the child's stack in the worker's memory before the child resets them.
    // - `child_main` makes only async-signal-safe system calls and touches only `args`, which,
    //   like the strings its pointers reach and the stack, outlives the child's use of it:
    //   CLONE_VFORK suspends this thread until the child has exec'd or exited.
    let pid = unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut previous);
        let pid = libc::clone(
            child_main,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&raw mut args).cast::<libc::c_void>(),
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
        if pid < 0 {
            return Err(io::Error::new(
                clone_error.kind(),
                format!("clone: {clone_error}"),
            ));
        }
        pid
    };
    drop(stack);
    // SAFETY: the child has exec'd or exited; nothing else writes `args` any more.
    let (failed_step, errno) = unsafe {
        (
            std::ptr::read_volatile(&raw const args.failed_step),
            std::ptr::read_volatile(&raw const args.errno),
        )
    };
    let step = Step::from_code(failed_step);
    if step == Step::None {
        return Ok(pid);
    }
    // The child exited after the failed step; reap it.
    let _ = reap(pid, 0);
    let error = io::Error::from_raw_os_error(errno);
    let what = match step {
        Step::WorkerGone => {
            return Err(io::Error::other(
                "the worker exited while the task was starting",
            ));
        }
        Step::ProcessGroup if prepared.detached => "setsid".to_string(),
        Step::ProcessGroup => "setpgid".to_string(),
        Step::User => format!(
            "switching to uid {} gid {} (--task-user needs the worker to run as root)",
            args.uid, args.gid
        ),
        Step::DeathSignal => "prctl(PR_SET_PDEATHSIG)".to_string(),
        Step::Stdio => "redirecting stdin, stdout and stderr".to_string(),
        Step::WorkingDir => format!(
            "working directory {:?}",
            prepared
                .working_dir
                .as_ref()
                .map(|dir| dir.to_string_lossy())
                .unwrap_or_default()
        ),
        Step::None | Step::Exec => format!("executing {:?}", prepared.path.to_string_lossy()),
    };
    Err(io::Error::new(error.kind(), format!("{what}: {error}")))
}

/// The child, between `clone` and `exec`. Only system calls: no allocation, no lock, no panic.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive and unaliased while the parent waits.
    let args = unsafe { &mut *arg.cast::<ChildArgs>() };
    // SAFETY: every call below is an async-signal-safe system call wrapper on memory the
    // parent prepared; on failure the child records the step and exits without unwinding.
    unsafe {
        let fail = |args: &mut ChildArgs, step: Step| -> ! {
            std::ptr::write_volatile(&raw mut args.errno, *libc::__errno_location());
            std::ptr::write_volatile(&raw mut args.failed_step, step as i32);
            libc::_exit(127)
        };

        let mut action: libc::sigaction = std::mem::zeroed();
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for signal in 1..=64 {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            if libc::sigaction(signal, std::ptr::null(), &mut action) != 0 {
                continue;
            }
            let handled =
                action.sa_sigaction != libc::SIG_DFL && action.sa_sigaction != libc::SIG_IGN;
            if handled || signal == libc::SIGPIPE {
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());

        let grouped = if args.detached != 0 {
            libc::setsid() >= 0
        } else {
            libc::setpgid(0, 0) == 0
        };
        if !grouped {
            fail(args, Step::ProcessGroup);
        }
        // Groups first, then the group id, then the user id: once the user id is not root's,
        // the others can no longer change. Raw system calls change this process alone.
        if args.switch_user != 0
            && (libc::syscall(libc::SYS_setgroups, args.ngroups, args.groups) != 0
                || libc::syscall(libc::SYS_setresgid, args.gid, args.gid, args.gid) != 0
                || libc::syscall(libc::SYS_setresuid, args.uid, args.uid, args.uid) != 0)
        {
            fail(args, Step::User);
        }
        // SIGKILL when the thread that started the child dies, even by `kill -9` of the
        // worker, so a crashed worker leaves no task running that no scheduler can see or fence.
        if args.detached == 0 && libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            fail(args, Step::DeathSignal);
        }
        if args.detached == 0 && libc::getppid() != args.worker_pid {
            fail(args, Step::WorkerGone);
        }
        for (target, fd) in args.stdio.into_iter().enumerate() {
            // The sources are all above 2 (see `above_stdio`), so no dup2 overwrites another.
            if libc::dup2(fd, target as libc::c_int) < 0 {
                fail(args, Step::Stdio);
            }
        }
        if !args.working_dir.is_null() && libc::chdir(args.working_dir) != 0 {
            fail(args, Step::WorkingDir);
        }
        libc::execve(args.path, args.argv, args.envp);
        fail(args, Step::Exec)
    }
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

fn c_string(value: &OsStr, what: &str) -> io::Result<CString> {
    CString::new(value.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} contains a NUL byte: {:?}", value.to_string_lossy()),
        )
    })
}

fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

fn open_dev_null() -> io::Result<OwnedFd> {
    Ok(std::fs::File::open("/dev/null")?.into())
}

/// A pipe, both ends close-on-exec (the child gets its end by `dup2`, which clears the flag);
/// returns (read, write), the write end above the three standard descriptors.
fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((read, above_stdio(write)?))
}

/// `fd`, moved above 0, 1 and 2 when it is one of them (a worker started with a closed stdin
/// gets its next descriptor there), so the child's `dup2` onto them never clobbers a source.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor we own, or -1.
    let moved = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if moved < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `moved` is a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(moved) })
}

/// A pidfd for `pid`. For our own unreaped child the pid cannot have been recycled; for any
/// other process the caller checks afterwards that the pid is still the one it meant.
pub(crate) fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open returns a new descriptor, or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: `fd` is a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `waitpid` on our own child: `Some(status)` once it has exited, `None` with WNOHANG while it
/// runs.
fn reap(pid: libc::pid_t, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes the status of our own child.
        let reaped = unsafe { libc::waitpid(pid, &mut status, flags) };
        if reaped == pid {
            return Ok(Some(ExitStatus::from_raw(status)));
        }
        if reaped == 0 {
            return Ok(None);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

fn kill_and_reap(pid: libc::pid_t) {
    // SAFETY: `pid` is our own unreaped child.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = reap(pid, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn output(process: &mut TaskProcess) -> (String, String, ExitStatus) {
        let (stdout, stderr, status) = process.output().await.expect("output");
        let text = |bytes| String::from_utf8(bytes).expect("UTF-8 output");
        (text(stdout), text(stderr), status)
    }

    fn shell(script: &str) -> TaskCommand {
        let mut command = TaskCommand::new("/bin/sh");
        command.arg("-c").arg(script);
        command
    }

    #[tokio::test]
    async fn a_task_writes_both_pipes_reads_an_empty_stdin_and_reports_its_exit() {
        let mut process = shell("echo out; echo err >&2; cat; exit 3")
            .spawn()
            .expect("spawn");
        let (stdout, stderr, status) = output(&mut process).await;
        assert_eq!(stdout, "out\n");
        assert_eq!(stderr, "err\n");
        assert_eq!(status.code(), Some(3));
        assert_eq!(process.wait().await.expect("wait again").code(), Some(3));

        let mut process = shell("kill -TERM $$").spawn().expect("spawn");
        let (_, _, status) = output(&mut process).await;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
    }

    #[tokio::test]
    async fn a_task_leads_its_own_group_with_default_signals_and_the_given_env_and_dir() {
        let dir = tempfile::tempdir().expect("dir");
        let mut command = shell(
            "echo \"$$ $(cut -d' ' -f5 /proc/$$/stat)\"; \
             grep -E '^Sig(Blk|Ign)' /proc/self/status; pwd; echo \"$AX_TEST_VALUE\"; \
             echo \"${HOME:+home is set}\"",
        );
        command
            .env("AX_TEST_VALUE", "a value with spaces")
            .current_dir(dir.path());
        let mut process = command.spawn().expect("spawn");
        let pid = process.id();
        let (stdout, stderr, status) = output(&mut process).await;
        assert!(status.success(), "{stderr}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines[0], format!("{pid} {pid}"), "the task leads its group");
        // No signal blocked, and SIGPIPE (bit 13) not ignored, though the test harness ignores it.
        assert_eq!(lines[1], "SigBlk:\t0000000000000000");
        let ignored =
            u64::from_str_radix(lines[2].trim_start_matches("SigIgn:\t"), 16).expect("mask");
        assert_eq!(ignored & (1 << (libc::SIGPIPE - 1)), 0, "{}", lines[2]);
        let canonical = dir.path().canonicalize().expect("canonical");
        assert_eq!(lines[3], canonical.to_string_lossy());
        assert_eq!(lines[4], "a value with spaces");
        if std::env::var_os("HOME").is_some() {
            assert_eq!(
                lines[5], "home is set",
                "the worker's environment is inherited"
            );
        }
    }

    #[tokio::test]
    async fn a_program_is_found_on_the_tasks_path() {
        let dir = tempfile::tempdir().expect("dir");
        let script = dir.path().join("ax-spawn-test-tool");
        std::fs::write(&script, "#!/bin/sh\necho found \"$@\"\n").expect("write");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut command = TaskCommand::new("ax-spawn-test-tool");
        command
            .arg("it")
            .env("PATH", format!("/nonexistent:{}", dir.path().display()));
        // Another test's child may hold the script's write descriptor for the instant between
        // its clone and its exec (Text file busy); that passes.
        let mut busy = 0;
        let mut process = loop {
            match command.spawn() {
                Err(error) if error.kind() == io::ErrorKind::ExecutableFileBusy && busy < 100 => {
                    busy += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                started => break started.expect("spawn"),
            }
        };
        let (stdout, _, status) = output(&mut process).await;
        assert!(status.success());
        assert_eq!(stdout, "found it\n");
    }

    #[tokio::test]
    async fn each_failing_step_names_what_was_wrong() {
        let error = TaskCommand::new("ax-no-such-program")
            .spawn()
            .expect_err("not found");
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        assert!(error.to_string().contains("ax-no-such-program"), "{error}");

        let mut command = shell("true");
        command.current_dir("/nonexistent/ax-spawn-test");
        let error = command.spawn().expect_err("no such dir");
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        assert!(error.to_string().contains("working directory"), "{error}");
        assert!(
            error.to_string().contains("/nonexistent/ax-spawn-test"),
            "{error}"
        );

        let dir = tempfile::tempdir().expect("dir");
        let not_executable = dir.path().join("data.txt");
        std::fs::write(&not_executable, "not a program").expect("write");
        let error = TaskCommand::new(not_executable.as_os_str())
            .spawn()
            .expect_err("not executable");
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
        assert!(error.to_string().contains("executing"), "{error}");

        let error = shell("true")
            .env("BAD=NAME", "x")
            .spawn()
            .expect_err("bad env");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        assert!(error.to_string().contains("BAD=NAME"), "{error}");

        let error = shell("echo \0").spawn().expect_err("NUL");
        assert!(error.to_string().contains("NUL"), "{error}");
    }

    #[test]
    fn a_task_dies_with_the_thread_that_started_it() {
        // The parent-death signal follows the starting thread: a task started on a thread that
        // then ends gets SIGKILL, which is what takes a task down with a killed worker.
        let pid = std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let mut process = TaskCommand::new("sleep").arg("300").spawn().expect("spawn");
                let pid = process.id();
                // Leave the reaping to this test, not to the dropped handle.
                process.exit = None;
                pid
            })
        })
        .join()
        .expect("thread");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let status = loop {
            if let Some(status) = reap(pid.cast_signed(), libc::WNOHANG).expect("waitpid") {
                break status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the task outlived the thread that started it"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}
