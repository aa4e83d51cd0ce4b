//! The Redis side of a call: its keys opened once each through the module API, read
//! and written in place (a state string of the same length is overwritten where it
//! lies), their writes replicated as effects (`SET key value PXAT ms`), so a replica
//! or the AOF holds the same state and expiry whatever its own clock says.
//!
//! Raw API calls, not redis-module's wrappers: those allocate a string (or several)
//! per write, and a decision's cost to Redis is this crate's reason to be.

use std::ffi::{c_char, c_int};
use std::ptr::{self, NonNull};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString};

use crate::call::Keys;

/// A module API function the server offers (every one used here is part of the API
/// of Redis 7 and Valkey 7.2 and later, which the store alone sends calls to).
macro_rules! api {
    ($f:ident) => {
        raw::$f.expect(concat!(stringify!($f), " is part of the module API"))
    };
}
pub(crate) use api;

/// The keys of one call on the server.
pub struct ServerKeys<'a> {
    ctx: *mut RedisModuleCtx,
    names: &'a [*mut RedisModuleString],
    /// Each key opened at its first use (null until then), closed on drop.
    opened: Vec<*mut RedisModuleKey>,
    mode: c_int,
    /// The server's time in ms at the call's first write (a TTL is from it).
    now_ms: Option<i64>,
}

impl<'a> ServerKeys<'a> {
    /// The keys `names` of a call on `ctx`; `write`: opened for writing too.
    pub fn new(ctx: *mut RedisModuleCtx, names: &'a [*mut RedisModuleString], write: bool) -> Self {
        let mode = raw::REDISMODULE_READ as c_int
            | if write {
                raw::REDISMODULE_WRITE as c_int
            } else {
                0
            };
        ServerKeys {
            ctx,
            names,
            opened: vec![ptr::null_mut(); names.len()],
            mode,
            now_ms: None,
        }
    }

    fn key(&mut self, i: usize) -> *mut RedisModuleKey {
        if self.opened[i].is_null() {
            // SAFETY: ctx and the name are the server's, alive for the call.
            self.opened[i] =
                unsafe { api!(RedisModule_OpenKey)(self.ctx, self.names[i], self.mode) };
        }
        self.opened[i]
    }

    /// Key `i`'s string, read (`mode` READ) or to write in place (WRITE).
    fn dma(&mut self, i: usize, mode: u32) -> Option<&mut [u8]> {
        let key = self.key(i);
        let mut len = 0;
        // SAFETY: an open key; a null answer (not a string) is handled.
        let at = unsafe { api!(RedisModule_StringDMA)(key, &mut len, mode as c_int) };
        // The buffer lives until the key is written or closed, both after its use.
        NonNull::new(at.cast::<u8>())
            .map(|p| unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) })
    }

    fn key_type(&mut self, i: usize) -> isize {
        let key = self.key(i);
        // SAFETY: an open key.
        unsafe { api!(RedisModule_KeyType)(key) as isize }
    }
}

impl Keys for ServerKeys<'_> {
    fn get(&mut self, i: usize) -> Result<Option<&[u8]>, String> {
        match self.key_type(i) {
            raw::REDISMODULE_KEYTYPE_EMPTY => Ok(None),
            raw::REDISMODULE_KEYTYPE_STRING => Ok(self.dma(i, raw::REDISMODULE_READ).map(|b| &*b)),
            _ => Err(format!(
                "key {} holds no tollgate state (not a string)",
                String::from_utf8_lossy(self.name(i))
            )),
        }
    }

    fn name(&self, i: usize) -> &[u8] {
        string_bytes(self.names[i])
    }

    fn set(&mut self, i: usize, value: &[u8], ttl_ms: u64) {
        let key = self.key(i);
        // A string of another length is resized first (an absent key is made one);
        // then the bytes are written where the value lies. Neither can fail on a key
        // opened for writing that holds a string or nothing (anything else failed to
        // read before the check was decided).
        // SAFETY: an open key.
        unsafe {
            if self
                .dma(i, raw::REDISMODULE_WRITE)
                .is_none_or(|b| b.len() != value.len())
            {
                api!(RedisModule_StringTruncate)(key, value.len());
            }
        }
        if let Some(b) = self
            .dma(i, raw::REDISMODULE_WRITE)
            .filter(|b| b.len() == value.len())
        {
            b.copy_from_slice(value);
        }
        let ctx = self.ctx;
        // SAFETY: the server's clock; read once per call.
        let now = *(self.now_ms).get_or_insert_with(|| unsafe { api!(RedisModule_Milliseconds)() });
        let at = now.saturating_add(i64::try_from(ttl_ms).unwrap_or(i64::MAX));
        // SAFETY: an open key; the format's arguments are a module string, a buffer
        // and its length, a C string and a long long, as it says.
        unsafe {
            api!(RedisModule_SetAbsExpire)(key, at);
            api!(RedisModule_Replicate)(
                ctx,
                c"SET".as_ptr(),
                c"sbcl".as_ptr(),
                self.names[i],
                value.as_ptr().cast::<c_char>(),
                value.len(),
                c"PXAT".as_ptr(),
                at as std::ffi::c_longlong,
            );
        }
    }

    fn delete(&mut self, i: usize) {
        let key = self.key(i);
        // SAFETY: an open key; the format's argument is a module string.
        unsafe {
            api!(RedisModule_DeleteKey)(key);
            api!(RedisModule_Replicate)(self.ctx, c"DEL".as_ptr(), c"s".as_ptr(), self.names[i]);
        }
    }

    fn time_us(&mut self) -> u64 {
        // The clock `TIME` reads (the server's wall clock), without a command call.
        #[allow(clippy::disallowed_methods)]
        let t = std::time::SystemTime::now();
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}

impl Drop for ServerKeys<'_> {
    fn drop(&mut self) {
        for &key in self.opened.iter().filter(|k| !k.is_null()) {
            // SAFETY: a key this call opened, closed once.
            unsafe { api!(RedisModule_CloseKey)(key) };
        }
    }
}

/// A module string's bytes (alive as long as the string).
pub fn string_bytes<'a>(s: *mut RedisModuleString) -> &'a [u8] {
    let mut len = 0;
    // SAFETY: a string the server handed to the command, alive for the call.
    unsafe {
        let at = api!(RedisModule_StringPtrLen)(s, &mut len);
        std::slice::from_raw_parts(at.cast::<u8>(), len)
    }
}
