//! Names the commit the binary is built from (`tollgate_build_info`, `--version`):
//! `TOLLGATE_COMMIT` when the build sets it, else `git rev-parse`, else `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=TOLLGATE_COMMIT");
    let commit = std::env::var("TOLLGATE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    // A new commit or checkout moves HEAD or the ref it names: build again then.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        // Only paths that exist: a missing one would run this at every build.
        for path in ["HEAD", "refs/heads", "packed-refs"] {
            let path = format!("{dir}/{path}");
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    println!("cargo:rustc-env=TOLLGATE_COMMIT={commit}");
}
