//! A server's life, for `serve` and `proxy` alike: what triggers a reload (SIGHUP, or
//! a change in the watched files' modification times, checked every second) and what
//! stops it (SIGTERM or Ctrl-C).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The files under some paths with their modification times, in order.
type Stamp = Vec<(PathBuf, Option<SystemTime>)>;

/// The files under `paths` (a directory's entries, or the file itself) with their
/// modification times, in order: what a change is detected against.
pub fn stamp(paths: &[PathBuf]) -> Stamp {
    let mut files = Vec::new();
    for p in paths {
        match std::fs::read_dir(p) {
            Ok(entries) => files.extend(entries.filter_map(|e| e.ok().map(|e| e.path()))),
            Err(_) => files.push(p.clone()),
        }
    }
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let modified = modified(&f);
            (f, modified)
        })
        .collect()
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The SIGHUPs a server has caught (none on platforms without signals).
#[cfg(unix)]
pub type Hangups = Option<tokio::signal::unix::Signal>;
/// The SIGHUPs a server has caught (none on platforms without signals).
#[cfg(not(unix))]
pub type Hangups = Option<()>;

/// SIGHUP, caught from now on: until this is called a SIGHUP ends the process (the
/// default action), so a server calls it before it says it is up. Call within a tokio
/// runtime.
pub fn hangups() -> Hangups {
    #[cfg(unix)]
    return tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    #[cfg(not(unix))]
    None
}

/// Files to watch for changes, with the modification times they are seen against.
pub struct Watched {
    paths: Vec<PathBuf>,
    last: Stamp,
}

impl Watched {
    /// `paths` as they are now: made before the server says it is up, so that a
    /// change made right after is seen however late the watching task starts.
    pub fn now(paths: Vec<PathBuf>) -> Watched {
        let last = stamp(&paths);
        Watched { paths, last }
    }
}

/// Calls `reload(reason)` on each SIGHUP of `hup` (from [`hangups`]) and whenever a
/// file of `watched` changes, until `stop` resolves.
pub async fn watch(
    watched: Watched,
    #[cfg_attr(not(unix), allow(unused_mut, unused_variables))] mut hup: Hangups,
    mut reload: impl FnMut(&str),
    stop: impl Future<Output = ()>,
) {
    let Watched { paths, mut last } = watched;
    tokio::pin!(stop);
    loop {
        #[cfg(unix)]
        let hangup = async {
            match hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let hangup = std::future::pending::<()>();
        let reason = tokio::select! {
            _ = &mut stop => return,
            _ = hangup => "SIGHUP",
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                let now = stamp(&paths);
                if now == last {
                    continue;
                }
                last = now;
                "a file changed"
            }
        };
        reload(reason);
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
