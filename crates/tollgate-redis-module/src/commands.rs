//! The module's commands: registration, keys declared, arguments handed to
//! `call.rs`, errors and panics answered as errors.

use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{redis_module, Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::call::{self, Out};
use crate::keys::ServerKeys;
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
/// arguments decided, any error or panic answered as an error.
fn entry(ctx: &Context, args: Vec<RedisString>, e: Entry) -> RedisResult {
    let words: Vec<&[u8]> = args[1..].iter().map(|a| a.as_slice()).collect();
    let n_keys =
        call::key_count(&words).map_err(|e| RedisError::String(format!("ERR tollgate: {e}")))?;
    if ctx.is_keys_position_request() {
        for i in 0..n_keys {
            ctx.key_at_pos((i + 2) as i32);
        }
        return Ok(RedisValue::NoReply);
    }
    let keys = &args[2..2 + n_keys];
    let rest = &words[1 + n_keys..];
    let mut server = ServerKeys { ctx, keys };
    let answer = catch_unwind(AssertUnwindSafe(|| match e {
        Entry::Batch => call::batch(n_keys, rest, false, &mut server),
        Entry::Peek => call::batch(n_keys, rest, true, &mut server),
        Entry::Try => call::one(n_keys, rest, false, &mut server),
        Entry::Charge => call::one(n_keys, rest, true, &mut server),
    }));
    match answer {
        Ok(Ok(out)) => Ok(RedisValue::Array(out.into_iter().map(value).collect())),
        Ok(Err(msg)) => Err(RedisError::String(format!("ERR tollgate: {msg}"))),
        Err(_) => Err(RedisError::Str(
            "ERR tollgate: internal error (a bug: please report it)",
        )),
    }
}

fn value(o: Out) -> RedisValue {
    match o {
        Out::Int(i) => RedisValue::Integer(i),
        Out::Text(s) => RedisValue::BulkString(s),
    }
}

fn batch(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    entry(ctx, args, Entry::Batch)
}

fn peek(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    entry(ctx, args, Entry::Peek)
}

fn try_one(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    entry(ctx, args, Entry::Try)
}

fn charge(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    entry(ctx, args, Entry::Charge)
}

fn wire(_: &Context, _: Vec<RedisString>) -> RedisResult {
    Ok(RedisValue::Integer(WIRE))
}

redis_module! {
    name: "tollgate",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    commands: [
        ["tollgate.batch", batch, "write deny-oom getkeys-api", 1, 1, 1, ""],
        ["tollgate.try", try_one, "write deny-oom getkeys-api", 1, 1, 1, ""],
        ["tollgate.charge", charge, "write deny-oom getkeys-api", 1, 1, 1, ""],
        ["tollgate.peek", peek, "readonly getkeys-api", 1, 1, 1, ""],
        ["tollgate.wire", wire, "readonly fast", 0, 0, 0, ""],
    ],
}
