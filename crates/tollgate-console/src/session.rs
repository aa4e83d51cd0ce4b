//! Who may act in the console: a session opened with the admin token, held in an
//! `HttpOnly`, `SameSite=Strict` cookie, and a per-session form token that every
//! admin form carries back (so another site cannot post one, even where a browser
//! would send the cookie).

use std::collections::HashMap;
use std::sync::Mutex;

use ring::rand::{SecureRandom, SystemRandom};

/// Sessions open at once; the oldest is closed to make room.
pub const MAX_SESSIONS: usize = 64;
/// How long a session lasts, in seconds.
pub const SESSION_SECONDS: u64 = 8 * 3600;
/// The cookie's name.
pub const COOKIE: &str = "tollgate_console";

/// An open session: its form token and when it ends (seconds, the sessions' clock).
#[derive(Debug, Clone)]
pub struct Session {
    /// Every admin form carries it back.
    pub form_token: String,
    ends: u64,
}

/// The console's sessions, bounded.
pub struct Sessions {
    token: Option<String>,
    random: SystemRandom,
    open: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// Sessions opened with `token` (none: admin actions are off).
    pub fn new(token: Option<String>) -> Sessions {
        Sessions {
            token: token.filter(|t| !t.is_empty()),
            random: SystemRandom::new(),
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Whether there is an admin token at all.
    pub fn enabled(&self) -> bool {
        self.token.is_some()
    }

    /// A new session id when `given` is the admin token, at `now` (seconds).
    pub fn open(&self, given: &str, now: u64) -> Option<(String, Session)> {
        let token = self.token.as_deref()?;
        if !same(given.trim().as_bytes(), token.as_bytes()) {
            return None;
        }
        let id = self.random_hex()?;
        let session = Session {
            form_token: self.random_hex()?,
            ends: now + SESSION_SECONDS,
        };
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|_, s| s.ends > now);
        if open.len() >= MAX_SESSIONS {
            let oldest = (open.iter().min_by_key(|(_, s)| s.ends)).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                open.remove(&k);
            }
        }
        open.insert(id.clone(), session.clone());
        Some((id, session))
    }

    /// The session of a request's `Cookie` header, if open at `now`.
    pub fn of(&self, cookie_header: Option<&str>, now: u64) -> Option<Session> {
        let id = cookie_header?
            .split(';')
            .filter_map(|c| c.trim().split_once('='))
            .find(|(k, _)| *k == COOKIE)?
            .1;
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(id).filter(|s| s.ends > now).cloned()
    }

    /// Closes the session of a `Cookie` header.
    pub fn close(&self, cookie_header: Option<&str>) {
        let Some(cookies) = cookie_header else { return };
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        for (k, v) in cookies.split(';').filter_map(|c| c.trim().split_once('=')) {
            if k == COOKIE {
                open.remove(v);
            }
        }
    }

    fn random_hex(&self) -> Option<String> {
        let mut bytes = [0u8; 16];
        self.random.fill(&mut bytes).ok()?;
        Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// Whether two secrets are equal, in time that does not depend on where they differ.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    let digest = |x: &[u8]| ring::digest::digest(&ring::digest::SHA256, x);
    let (a, b) = (digest(a), digest(b));
    (a.as_ref().iter().zip(b.as_ref())).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_needs_the_token_and_ends() {
        let s = Sessions::new(Some("secret".into()));
        assert!(s.open("wrong", 0).is_none());
        let (id, session) = s.open("secret", 0).unwrap();
        let cookie = format!("other=1; {COOKIE}={id}");
        let found = s.of(Some(&cookie), 10).unwrap();
        assert_eq!(found.form_token, session.form_token);
        assert!(s.of(Some(&cookie), SESSION_SECONDS).is_none());
        assert!(s.of(Some("tollgate_console=forged"), 10).is_none());
        s.close(Some(&cookie));
        assert!(s.of(Some(&cookie), 10).is_none());
    }

    #[test]
    fn without_a_token_nobody_opens_one_and_sessions_stay_bounded() {
        assert!(Sessions::new(None).open("", 0).is_none());
        assert!(Sessions::new(Some(String::new())).open("", 0).is_none());
        let s = Sessions::new(Some("t".into()));
        for i in 0..(MAX_SESSIONS as u64 * 2) {
            s.open("t", i).unwrap();
        }
        assert_eq!(s.open.lock().unwrap().len(), MAX_SESSIONS);
    }
}
