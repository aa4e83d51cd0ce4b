//! The module's commands: registration, keys declared, arguments handed to
//! `call.rs`, answers written, errors and panics answered as errors.
//!
//! Registered and answered through the raw module API: redis-module's command
//! wrapper copies every argument into a vector of owned strings and every answer into
//! a tree of values, which cost Redis more than deciding a check does.

use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};
use redis_module::{redis_module, Context, RedisString, Status};

use crate::call::{self, Out};
use crate::keys::{api, string_bytes, ServerKeys};
use crate::WIRE;

/// Which entry point a command is.
#[derive(Clone, Copy)]
enum Entry {
    Batch,
    Peek,
    Try,
    Charge,
}

/// A command's edge: its keys declared (for Cluster routing and ACLs), its
/// arguments decided, its answer written; any error or panic answered as an error.
fn entry(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    e: Entry,
) -> c_int {
    // SAFETY: the server hands `argc` strings, alive for the call.
    let args = unsafe { std::slice::from_raw_parts(argv, usize::try_from(argc).unwrap_or(0)) };
    let words: Vec<&[u8]> = args.iter().skip(1).map(|&a| string_bytes(a)).collect();
    let n_keys = match call::key_count(&words) {
        Ok(n) => n,
        Err(msg) => return error(ctx, &msg),
    };
    // SAFETY: the call's own context.
    if unsafe { api!(RedisModule_IsKeysPositionRequest)(ctx) } != 0 {
        for i in 0..n_keys {
            // SAFETY: as above; positions counted from the command's name.
            unsafe { api!(RedisModule_KeyAtPos)(ctx, (i + 2) as c_int) };
        }
        return raw::REDISMODULE_OK as c_int;
    }
    let rest = &words[1 + n_keys..];
    let mut keys = ServerKeys::new(ctx, &args[2..2 + n_keys], !matches!(e, Entry::Peek));
    let answer = catch_unwind(AssertUnwindSafe(|| match e {
        Entry::Batch => call::batch(n_keys, rest, false, &mut keys),
        Entry::Peek => call::batch(n_keys, rest, true, &mut keys),
        Entry::Try => call::one(n_keys, rest, false, &mut keys),
        Entry::Charge => call::one(n_keys, rest, true, &mut keys),
    }));
    match answer {
        Ok(Ok(reply)) => {
            // SAFETY: the call's own context; buffers alive across each call.
            unsafe {
                api!(RedisModule_ReplyWithArray)(ctx, reply.len() as _);
                for item in reply.iter() {
                    match item {
                        Out::Int(n) => api!(RedisModule_ReplyWithLongLong)(ctx, n),
                        Out::Text(t) => api!(RedisModule_ReplyWithStringBuffer)(
                            ctx,
                            t.as_ptr().cast::<c_char>(),
                            t.len(),
                        ),
                    };
                }
            }
            raw::REDISMODULE_OK as c_int
        }
        Ok(Err(msg)) => error(ctx, &msg),
        Err(_) => error(ctx, "internal error (a bug: please report it)"),
    }
}

/// Answers `ERR tollgate: msg`.
fn error(ctx: *mut RedisModuleCtx, msg: &str) -> c_int {
    // A message holds no NUL (the server's error line could not carry it).
    let text = format!("ERR tollgate: {}\0", msg.replace('\0', " "));
    // SAFETY: a NUL-terminated string, alive across the call.
    unsafe { api!(RedisModule_ReplyWithError)(ctx, text.as_ptr().cast::<c_char>()) };
    raw::REDISMODULE_OK as c_int
}

/// The server's entry point of each command that decides: `entry` with its kind.
macro_rules! deciding {
    ($($f:ident = $e:ident;)*) => {$(
        extern "C" fn $f(
            ctx: *mut RedisModuleCtx,
            argv: *mut *mut RedisModuleString,
            argc: c_int,
        ) -> c_int {
            entry(ctx, argv, argc, Entry::$e)
        }
    )*};
}

deciding! {
    batch = Batch;
    peek = Peek;
    try_one = Try;
    charge = Charge;
}

extern "C" fn wire(ctx: *mut RedisModuleCtx, _: *mut *mut RedisModuleString, _: c_int) -> c_int {
    // SAFETY: the call's own context.
    unsafe { api!(RedisModule_ReplyWithLongLong)(ctx, WIRE) };
    raw::REDISMODULE_OK as c_int
}

type Command = extern "C" fn(*mut RedisModuleCtx, *mut *mut RedisModuleString, c_int) -> c_int;

/// The commands: name, function, flags, and first key, last key, step (all 0 for a
/// command without keys; the others declare theirs with the getkeys API).
const COMMANDS: [(&CStr, Command, &CStr, c_int); 5] = [
    (c"tollgate.batch", batch, c"write deny-oom getkeys-api", 1),
    (c"tollgate.try", try_one, c"write deny-oom getkeys-api", 1),
    (c"tollgate.charge", charge, c"write deny-oom getkeys-api", 1),
    (c"tollgate.peek", peek, c"readonly getkeys-api", 1),
    (c"tollgate.wire", wire, c"readonly fast", 0),
];

fn register(ctx: &Context, _: &[RedisString]) -> Status {
    for (name, f, flags, key) in COMMANDS {
        // SAFETY: the module's load context; static names and flags.
        let done = unsafe {
            api!(RedisModule_CreateCommand)(
                ctx.ctx,
                name.as_ptr(),
                Some(f),
                flags.as_ptr(),
                key,
                key,
                key,
            )
        };
        if done != raw::REDISMODULE_OK as c_int {
            ctx.log_warning(&format!("tollgate: could not create the command {name:?}"));
            return Status::Err;
        }
    }
    Status::Ok
}

redis_module! {
    name: "tollgate",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    init: register,
    commands: [],
}
