//! The Redis side of a call: its keys opened through the module API, their writes
//! replicated as effects (`SET key value PXAT ms`), so a replica or the AOF holds the
//! same state and expiry whatever its own clock says.

use std::time::Duration;

use redis_module::{raw, Context, RedisString};

use crate::call::Keys;

/// The keys of one call on the server.
pub struct ServerKeys<'a> {
    pub ctx: &'a Context,
    pub keys: &'a [RedisString],
}

impl Keys for ServerKeys<'_> {
    fn get(&mut self, i: usize) -> Result<Option<String>, String> {
        let key = self.ctx.open_key(&self.keys[i]);
        let bytes = (key.read()).map_err(|_| {
            format!(
                "key {} holds no tollgate state (not a string)",
                self.keys[i]
            )
        })?;
        bytes
            .map(|b| String::from_utf8(b.to_vec()))
            .transpose()
            .map_err(|_| format!("key {} holds no tollgate state (not UTF-8)", self.keys[i]))
    }

    fn name(&self, i: usize) -> &[u8] {
        self.keys[i].as_slice()
    }

    fn set(&mut self, i: usize, value: &str, ttl_ms: u64) {
        let key = self.ctx.open_key_writable(&self.keys[i]);
        // Writing a string key opened for writing cannot fail; a key of another type
        // failed to read above, before anything was decided.
        let _ = key.write(value);
        let _ = key.set_expire(Duration::from_millis(ttl_ms));
        // SAFETY: Milliseconds is part of every module API this module loads on.
        let at = unsafe { raw::RedisModule_Milliseconds.expect("RedisModule_Milliseconds")() };
        let at = (at as u64).saturating_add(ttl_ms).to_string();
        let name = self.keys[i].as_slice();
        self.ctx
            .replicate("SET", &[name, value.as_bytes(), b"PXAT", at.as_bytes()]);
    }

    fn delete(&mut self, i: usize) {
        let _ = self.ctx.open_key_writable(&self.keys[i]).delete();
        self.ctx.replicate("DEL", &[self.keys[i].as_slice()]);
    }

    fn time_us(&mut self) -> u64 {
        // The clock `TIME` reads (the server's wall clock), without a command call.
        #[allow(clippy::disallowed_methods)]
        let t = std::time::SystemTime::now();
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}
