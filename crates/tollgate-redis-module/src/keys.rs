//! The Redis side of a call: its keys opened once each through the module API, read
//! and written in place (a state string of the same length is overwritten where it
//! lies), their writes replicated as effects (`SET key value PXAT ms`), so a replica
//! or the AOF holds the same state and expiry whatever its own clock says.
//!
//! Raw API calls, not redis-module's wrappers: those allocate a string (or several)
//! per write, and a decision's cost to Redis is this crate's reason to be.

use std::ffi::{c_char, c_int, CStr};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString};

use crate::call::Keys;
use crate::counter::Counters;

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
    /// The arguments after the keys (`TOLLGATE.COUNT` replicates some as they are).
    args: &'a [*mut RedisModuleString],
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
            args: &[],
        }
    }

    /// The call's arguments after its keys.
    pub fn arguments(&mut self, args: &'a [*mut RedisModuleString]) {
        self.args = args;
    }

    /// Writes `value` where key `i`'s string lies, resized first when its length
    /// differs (an absent key is made one). Neither can fail on a key opened for
    /// writing that holds a string or nothing (anything else failed to read before).
    fn overwrite(&mut self, i: usize, value: &[u8]) {
        let key = self.key(i);
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
    }

    /// Replicates `command` with `args` (module strings the call holds) and, if
    /// given, a number last.
    fn replicate(&self, command: &CStr, (args, last): (&[*mut RedisModuleString], Option<i64>)) {
        // SAFETY: the call's context; the formats' arguments are a vector of module
        // strings and its length, then a long long, as they say.
        unsafe {
            let replicate = api!(RedisModule_Replicate);
            let (strings, n) = (args.as_ptr(), args.len());
            match last {
                Some(l) => replicate(self.ctx, command.as_ptr(), c"vl".as_ptr(), strings, n, l),
                None => replicate(self.ctx, command.as_ptr(), c"v".as_ptr(), strings, n),
            };
        }
    }

    /// The absolute time (ms, the server's clock, read once per call) `ttl_ms` from now.
    fn at(&mut self, ttl_ms: u64) -> i64 {
        // SAFETY: the server's clock.
        let now = *(self.now_ms).get_or_insert_with(|| unsafe { api!(RedisModule_Milliseconds)() });
        now.saturating_add(i64::try_from(ttl_ms).unwrap_or(i64::MAX))
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
        self.overwrite(i, value);
        let key = self.key(i);
        let ctx = self.ctx;
        let at = self.at(ttl_ms);
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

/// A window counter's keys: made by `SET key cost PXAT at`, counted in place, their
/// changes replicated as `INCRBY`, `DECRBY` and `PEXPIREAT` (a replicated cost is the
/// very argument string the call was given).
impl Counters for ServerKeys<'_> {
    fn count(&mut self, i: usize) -> Result<Option<u64>, String> {
        let name = |me: &Self| String::from_utf8_lossy(me.name(i)).into_owned();
        match self.get(i)? {
            None => Ok(None),
            Some(text) => (std::str::from_utf8(text).ok())
                .and_then(|t| t.parse::<u64>().ok())
                .map(Some)
                .ok_or_else(|| format!("key {} holds no count (not a whole number)", name(self))),
        }
    }

    fn make(&mut self, i: usize, arg: usize, ttl_ms: u64) {
        let (key, at) = (self.key(i), self.at(ttl_ms));
        // The very string sent (made by resizing an empty key and writing in place
        // costs the server more: callgrind, 2.3k instructions against 2.0k).
        // SAFETY: an open key (absent), and a string the server handed to the call.
        unsafe {
            api!(RedisModule_StringSet)(key, self.args[arg]);
            api!(RedisModule_SetAbsExpire)(key, at);
        }
        self.replicate(c"SET", (&[self.names[i], self.args[arg], pxat()], Some(at)));
    }

    fn raise(&mut self, i: usize, after: u64, by_arg: usize, ttl_ms: u64) {
        self.overwrite(i, itoa(after, &mut [0; 20]));
        self.replicate(c"INCRBY", (&[self.names[i], self.args[by_arg]], None));
        let key = self.key(i);
        // SAFETY: an open key.
        if unsafe { api!(RedisModule_GetAbsExpire)(key) } == raw::REDISMODULE_NO_EXPIRE as i64 {
            let at = self.at(ttl_ms);
            // SAFETY: an open key.
            unsafe { api!(RedisModule_SetAbsExpire)(key, at) };
            self.replicate(c"PEXPIREAT", (&[self.names[i]], Some(at)));
        }
    }

    fn lower(&mut self, i: usize, after: u64, by: u64) {
        self.overwrite(i, itoa(after, &mut [0; 20]));
        let by = i64::try_from(by).unwrap_or(i64::MAX);
        self.replicate(c"DECRBY", (&[self.names[i]], Some(by)));
    }
}

/// `n` in decimal, in `buf`.
fn itoa(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// The string `PXAT`, made once (for a replicated `SET`; a module string, as the
/// replicated arguments are).
fn pxat() -> *mut RedisModuleString {
    static PXAT: AtomicPtr<RedisModuleString> = AtomicPtr::new(ptr::null_mut());
    let s = PXAT.load(Ordering::Relaxed);
    if !s.is_null() {
        return s;
    }
    // SAFETY: no context: a string of the module's own, never freed (commands run
    // on the server's one thread).
    let s = unsafe { api!(RedisModule_CreateString)(ptr::null_mut(), c"PXAT".as_ptr(), 4) };
    PXAT.store(s, Ordering::Relaxed);
    s
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
