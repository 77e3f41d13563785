//! `--task-user USER[:GROUP]`: the account tasks run as, when it is not the worker's own.
//!
//! A task running as the worker's user can read what the worker can: its files (the token
//! file among them), its spill directory, and `/proc/<worker>/` of the worker and of every other
//! task (their environments hold their secrets). Another account is the boundary the kernel
//! enforces: the worker (root) starts each task with the account's user id, primary group and
//! supplementary groups, and `HOME`, `USER` and `LOGNAME` set for it. The account is looked up
//! once, at start.

use std::ffi::{CStr, CString};

/// The account tasks run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskUser {
    pub name: String,
    pub uid: libc::uid_t,
    /// The primary group: GROUP when given, else the account's own.
    pub gid: libc::gid_t,
    /// Every group the process holds: the account's supplementary groups and the primary one.
    pub groups: Vec<libc::gid_t>,
    pub home: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TaskUserError {
    #[error("--task-user {0:?}: expected USER or USER:GROUP (names or numbers)")]
    Syntax(String),
    #[error("--task-user: no user {0:?} on this host")]
    NoUser(String),
    #[error("--task-user: no group {0:?} on this host")]
    NoGroup(String),
    #[error("--task-user: looking up {what}: {source}")]
    Lookup {
        what: String,
        source: std::io::Error,
    },
    #[error(
        "--task-user needs the worker to run as root, to start tasks as another user (this \
         worker runs as uid {0})"
    )]
    NotRoot(libc::uid_t),
}

impl TaskUser {
    /// Looks `spec` (`USER` or `USER:GROUP`, each a name or a number) up in the host's
    /// account databases.
    pub fn resolve(spec: &str) -> Result<TaskUser, TaskUserError> {
        let (user, group) = match spec.split_once(':') {
            Some((user, group)) => (user, Some(group)),
            None => (spec, None),
        };
        if user.is_empty() || group.is_some_and(str::is_empty) || user.contains('\0') {
            return Err(TaskUserError::Syntax(spec.to_string()));
        }
        let account = lookup_user(user)?.ok_or_else(|| TaskUserError::NoUser(user.into()))?;
        let gid = match group {
            Some(group) => {
                lookup_group(group)?.ok_or_else(|| TaskUserError::NoGroup(group.into()))?
            }
            None => account.gid,
        };
        let groups = group_list(&account.name, gid)?;
        Ok(TaskUser {
            name: account.name,
            uid: account.uid,
            gid,
            groups,
            home: account.home,
        })
    }

    /// Refuses a worker that cannot switch users: it must run as root.
    pub fn check_worker_can_switch() -> Result<(), TaskUserError> {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if euid == 0 {
            Ok(())
        } else {
            Err(TaskUserError::NotRoot(euid))
        }
    }
}

struct Account {
    name: String,
    uid: libc::uid_t,
    gid: libc::gid_t,
    home: String,
}

/// Calls a `get*_r` function with a buffer that grows while it answers ERANGE.
fn with_buffer<T>(
    what: &str,
    mut call: impl FnMut(&mut [libc::c_char]) -> (libc::c_int, Option<T>),
) -> Result<Option<T>, TaskUserError> {
    let mut size = 4096;
    loop {
        let mut buffer = vec![0 as libc::c_char; size];
        let (error, found) = call(&mut buffer);
        match error {
            0 => return Ok(found),
            libc::ERANGE if size < (1 << 20) => size *= 4,
            // "Not found" comes as 0 with no entry, or as one of these on some C libraries.
            libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => return Ok(None),
            error => {
                return Err(TaskUserError::Lookup {
                    what: what.to_string(),
                    source: std::io::Error::from_raw_os_error(error),
                });
            }
        }
    }
}

fn lookup_user(user: &str) -> Result<Option<Account>, TaskUserError> {
    let name = CString::new(user).map_err(|_| TaskUserError::Syntax(user.into()))?;
    let by_name = with_buffer(&format!("user {user:?}"), |buffer| {
        // SAFETY: all-zero is a valid passwd, filled in by getpwnam_r.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: the pointers are valid for the call; the strings it sets point into `buffer`,
        // read before it is dropped.
        let error = unsafe {
            libc::getpwnam_r(
                name.as_ptr(),
                &mut entry,
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut result,
            )
        };
        // SAFETY: as above.
        (
            error,
            (!result.is_null()).then(|| unsafe { account(&entry) }),
        )
    })?;
    if by_name.is_some() {
        return Ok(by_name);
    }
    let Ok(uid) = user.parse::<libc::uid_t>() else {
        return Ok(None);
    };
    with_buffer(&format!("uid {uid}"), |buffer| {
        // SAFETY: as in the lookup by name.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: as in the lookup by name.
        let error = unsafe {
            libc::getpwuid_r(
                uid,
                &mut entry,
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut result,
            )
        };
        // SAFETY: as above.
        (
            error,
            (!result.is_null()).then(|| unsafe { account(&entry) }),
        )
    })
}

/// The fields of a `passwd` entry the C library just filled in.
///
/// # Safety
/// `entry`'s strings are valid C strings (or null).
unsafe fn account(entry: &libc::passwd) -> Account {
    // SAFETY: the caller's promise.
    let text = |pointer: *const libc::c_char| unsafe {
        if pointer.is_null() {
            String::new()
        } else {
            CStr::from_ptr(pointer).to_string_lossy().into_owned()
        }
    };
    Account {
        name: text(entry.pw_name),
        uid: entry.pw_uid,
        gid: entry.pw_gid,
        home: text(entry.pw_dir),
    }
}

fn lookup_group(group: &str) -> Result<Option<libc::gid_t>, TaskUserError> {
    let name = CString::new(group).map_err(|_| TaskUserError::Syntax(group.into()))?;
    let by_name = with_buffer(&format!("group {group:?}"), |buffer| {
        // SAFETY: all-zero is a valid group, filled in by getgrnam_r.
        let mut entry: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        // SAFETY: the pointers are valid for the call.
        let error = unsafe {
            libc::getgrnam_r(
                name.as_ptr(),
                &mut entry,
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut result,
            )
        };
        (error, (!result.is_null()).then_some(entry.gr_gid))
    })?;
    // A number names a group whether or not the group database lists it.
    Ok(by_name.or_else(|| group.parse().ok()))
}

/// The account's groups, `gid` first.
fn group_list(user: &str, gid: libc::gid_t) -> Result<Vec<libc::gid_t>, TaskUserError> {
    let name = CString::new(user).map_err(|_| TaskUserError::Syntax(user.into()))?;
    let mut size: libc::c_int = 32;
    loop {
        let mut groups = vec![0 as libc::gid_t; size as usize];
        let mut count = size;
        // SAFETY: `groups` holds `count` entries; getgrouplist writes at most that many and
        // sets `count` to the number it has.
        let found =
            unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if found >= 0 {
            groups.truncate(count.max(0) as usize);
            groups.retain(|&g| g != gid);
            groups.insert(0, gid);
            return Ok(groups);
        }
        if count <= size {
            // Too few entries, yet it did not say how many: grow anyway, up to a bound.
            count = size * 2;
        }
        if count > 65_536 {
            return Err(TaskUserError::Lookup {
                what: format!("the groups of {user:?}"),
                source: std::io::Error::other("more than 65,536 groups"),
            });
        }
        size = count;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_resolves_by_name_and_number() {
        let root = TaskUser::resolve("root").expect("root exists");
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(root.groups.first(), Some(&0));
        assert_eq!(TaskUser::resolve("0").expect("uid 0").name, "root");
        let with_group = TaskUser::resolve("root:0").expect("root:0");
        assert_eq!(with_group.gid, 0);
    }

    #[test]
    fn bad_specs_name_what_is_wrong() {
        let err = TaskUser::resolve("").unwrap_err().to_string();
        assert!(err.contains("expected USER or USER:GROUP"), "{err}");
        let err = TaskUser::resolve("root:").unwrap_err().to_string();
        assert!(err.contains("expected USER"), "{err}");
        let err = TaskUser::resolve("ax-no-such-user-xyz")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no user \"ax-no-such-user-xyz\""), "{err}");
        let err = TaskUser::resolve("root:ax-no-such-group-xyz")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no group \"ax-no-such-group-xyz\""), "{err}");
    }
}
