//! Where the browser checks and measurements live (`integration-tests/browser`), and whether
//! this machine can run them: chromium (`AX_CHROMIUM`, default `/usr/bin/chromium`), `node`,
//! and the node modules `npm ci` installs there.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory of the browser scripts and their `package.json`.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("browser")
}

/// chromium's path, or what is missing to drive it.
pub fn tools() -> Result<PathBuf, String> {
    let chromium = PathBuf::from(
        std::env::var("AX_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_string()),
    );
    if !chromium.exists() {
        return Err(format!("no chromium at {}", chromium.display()));
    }
    if Command::new("node").arg("--version").output().is_err() {
        return Err("no node on PATH".into());
    }
    if !dir().join("node_modules/playwright-core").exists() {
        return Err(format!(
            "no playwright-core: run `npm ci` in {}",
            dir().display()
        ));
    }
    Ok(chromium)
}
