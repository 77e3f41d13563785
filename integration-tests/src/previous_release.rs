//! The previous release's `ax-scheduler` and `ax-worker`, for the tests of rolling upgrades: the
//! commit named in `.ci/previous-release`, built by `.ci/build-previous-release` (a debug build
//! with the machine's cargo registry, cached under the commit, so a second run builds nothing)
//! unless `AX_PREVIOUS_RELEASE_BIN` names a directory that has them.
//!
//! [`PREVIOUS_RELEASE`] is met when the binaries are given or cached, or when they can be built
//! here (the commit is in the repository and cargo runs); otherwise the tests are reported as
//! ignored with the reason, and fail under `CI=true`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use ax_test_harness::Requirement;

/// The previous release's binaries, given, cached or buildable here.
pub static PREVIOUS_RELEASE: Requirement = Requirement::custom(
    available,
    "set AX_PREVIOUS_RELEASE_BIN to a directory with the previous release's ax-scheduler and \
     ax-worker, or run from a clone that has the commit of .ci/previous-release (and cargo) so \
     the test builds them (.ci/build-previous-release)",
);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The commit of the previous release, as `.ci/previous-release` names it.
pub fn commit() -> anyhow::Result<String> {
    let path = repo().join(".ci/previous-release");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let commit = text.trim().to_string();
    if commit.len() != 40 || !commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "{} does not hold a full commit hash: {text:?}",
            path.display()
        );
    }
    Ok(commit)
}

/// Where the builds are cached: `$AX_PREVIOUS_RELEASE_CACHE`, else `previous-release` in the
/// target directory (`$CARGO_TARGET_DIR`, or the one this test binary was built in).
fn cache() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("AX_PREVIOUS_RELEASE_CACHE").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("previous-release"));
    }
    // target/<profile>/deps/<test binary> → target/previous-release
    let exe = std::env::current_exe()?;
    let target = exe
        .ancestors()
        .nth(3)
        .context("locating the target directory")?;
    Ok(target.join("previous-release"))
}

fn has_both(dir: &Path) -> bool {
    ["ax-scheduler", "ax-worker"]
        .iter()
        .all(|name| dir.join(name).is_file())
}

fn given() -> Option<PathBuf> {
    std::env::var_os("AX_PREVIOUS_RELEASE_BIN")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
}

fn available() -> Result<(), String> {
    if let Some(dir) = given() {
        return match has_both(&dir) {
            true => Ok(()),
            false => Err(format!(
                "AX_PREVIOUS_RELEASE_BIN={} lacks ax-scheduler or ax-worker",
                dir.display()
            )),
        };
    }
    let commit = commit().map_err(|err| format!("{err:#}"))?;
    let cache = cache().map_err(|err| format!("{err:#}"))?;
    if has_both(&cache.join(&commit).join("bin")) {
        return Ok(());
    }
    let in_repo = Command::new("git")
        .arg("-C")
        .arg(repo())
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !in_repo {
        return Err(format!(
            "the previous release's binaries are not given and commit {commit} \
             (.ci/previous-release) is not in this repository to build them"
        ));
    }
    let cargo = Command::new("cargo")
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !cargo {
        return Err(
            "the previous release's binaries are not given and cargo is not on PATH \
                    to build them"
                .into(),
        );
    }
    Ok(())
}

/// The directory of the previous release's `ax-scheduler` and `ax-worker`: the given one, or
/// the cache's, built first when it is not there (minutes; blocking). Says on stderr how long a
/// build took.
pub fn binaries() -> anyhow::Result<PathBuf> {
    if let Some(dir) = given() {
        if !has_both(&dir) {
            bail!(
                "AX_PREVIOUS_RELEASE_BIN={} lacks ax-scheduler or ax-worker",
                dir.display()
            );
        }
        return Ok(dir);
    }
    let script = repo().join(".ci/build-previous-release");
    let started = Instant::now();
    let output = Command::new("bash")
        .arg(&script)
        .arg(cache()?)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!("{} failed: {}", script.display(), output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = PathBuf::from(
        stdout
            .lines()
            .last()
            .context("the build script printed no directory")?,
    );
    if !has_both(&dir) {
        bail!(
            "{} lacks ax-scheduler or ax-worker after the build",
            dir.display()
        );
    }
    eprintln!(
        "previous release {} ready in {:.0?} at {}",
        commit()?,
        started.elapsed(),
        dir.display()
    );
    Ok(dir)
}

/// The release of the `ax-scheduler` in `dir`, as its `--version` says (`ax-scheduler 0.1.0`).
pub fn release_of(dir: &Path) -> anyhow::Result<String> {
    let program = dir.join("ax-scheduler");
    let output = Command::new(&program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} --version", program.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.split_whitespace()
        .nth(1)
        .map(str::to_string)
        .with_context(|| format!("{} --version said {text:?}", program.display()))
}
