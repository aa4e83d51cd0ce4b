//! A Redis password kept in a file (a Kubernetes secret, mounted) and followed as it
//! rotates: each new connection logs in with what the file holds as it connects
//! (so a connection refused with the old password, then made again, takes the new
//! one), and each open connection logs in again (`AUTH`) once it sees the file
//! change (it looks every 2 s). A file that cannot be read while it is replaced
//! keeps the last password read.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Stream;
use redis::auth::{BasicAuth, StreamingCredentialsProvider};
use redis::{ErrorKind, RedisError, RedisResult};

/// How often an open connection looks at the file.
const WATCH_EVERY: Duration = Duration::from_secs(2);

/// The credentials of a password file, for every connection of a store.
#[derive(Clone)]
pub(crate) struct FileCredentials(Arc<Inner>);

struct Inner {
    path: PathBuf,
    /// The ACL user; `default` (Redis's own) when none is named, as `AUTH password`
    /// logs in.
    username: String,
    /// The password last read, for when the file cannot be read.
    last: Mutex<Option<String>>,
}

/// The credentials of `opts.password_file`, when it names one.
pub(crate) fn of(opts: &super::RedisOptions) -> Option<FileCredentials> {
    (opts.password_file.clone()).map(|path| FileCredentials::new(path, opts.username.as_deref()))
}

impl FileCredentials {
    /// The credentials of `path`, logging in as `username` (or the default user).
    pub(crate) fn new(path: PathBuf, username: Option<&str>) -> FileCredentials {
        FileCredentials(Arc::new(Inner {
            path,
            username: username.unwrap_or("default").to_string(),
            last: Mutex::new(None),
        }))
    }

    /// The password the file holds now (one trailing newline dropped), else the last
    /// one read.
    pub(crate) fn password(&self) -> RedisResult<String> {
        let mut last = self.0.last.lock().unwrap_or_else(|e| e.into_inner());
        match std::fs::read_to_string(&self.0.path) {
            Ok(text) => {
                let password = text.strip_suffix('\n').unwrap_or(&text);
                let password = password.strip_suffix('\r').unwrap_or(password).to_string();
                if last.as_deref().is_some_and(|l| l != password) {
                    tracing::info!(
                        file = %self.0.path.display(),
                        "redis: the password file changed: connections log in with the new password"
                    );
                }
                *last = Some(password.clone());
                Ok(password)
            }
            Err(e) => last.clone().ok_or_else(|| {
                RedisError::from((
                    ErrorKind::AuthenticationFailed,
                    "the password file cannot be read",
                    format!("{}: {e}", self.0.path.display()),
                ))
            }),
        }
    }

    fn auth(&self, password: String) -> BasicAuth {
        BasicAuth::new(self.0.username.clone(), password)
    }
}

impl StreamingCredentialsProvider for FileCredentials {
    /// The file's password now, then each new one as the file changes.
    fn subscribe(&self) -> Pin<Box<dyn Stream<Item = RedisResult<BasicAuth>> + Send + 'static>> {
        let me = self.clone();
        let first = me.password();
        let seen = first.as_ref().ok().cloned();
        Box::pin(futures_util::stream::unfold(
            (me, Some(first), seen),
            |(me, first, mut seen)| async move {
                if let Some(first) = first {
                    let item = first.map(|p| me.auth(p));
                    return Some((item, (me, None, seen)));
                }
                loop {
                    tokio::time::sleep(WATCH_EVERY).await;
                    let Ok(now) = me.password() else { continue };
                    if seen.as_deref() != Some(now.as_str()) {
                        seen = Some(now.clone());
                        return Some((Ok(me.auth(now)), (me, None, seen)));
                    }
                }
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test(start_paused = true)]
    async fn the_first_password_is_the_files_and_a_change_follows() {
        let dir = std::env::temp_dir().join(format!("tollgate-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        std::fs::write(&file, "old\n").unwrap();
        let creds = FileCredentials::new(file.clone(), None);
        let mut stream = creds.subscribe();
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!((first.username(), first.password()), ("default", "old"));
        std::fs::write(&file, "new").unwrap();
        let next = stream.next().await.unwrap().unwrap();
        assert_eq!(next.password(), "new");
        // Mid-replacement (no file): the last password read, for a new connection.
        std::fs::remove_file(&file).unwrap();
        let again = creds.subscribe().next().await.unwrap().unwrap();
        assert_eq!(again.password(), "new");
        std::fs::remove_dir_all(&dir).ok();
    }
}
