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
    // A new commit or checkout moves HEAD or the ref it names: build again then. In a
    // linked worktree HEAD is the worktree's own and the refs are the common
    // directory's.
    let dirs = ["--absolute-git-dir", "--git-common-dir"]
        .map(|arg| git(&["rev-parse", "--path-format=absolute", arg]));
    for (dir, paths) in dirs
        .iter()
        .zip([&["HEAD"][..], &["refs/heads", "packed-refs"]])
    {
        let Some(dir) = dir else { continue };
        // Only paths that exist: a missing one would run this at every build.
        for path in paths {
            let path = std::path::Path::new(dir).join(path);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    println!("cargo:rustc-env=TOLLGATE_COMMIT={commit}");
}
