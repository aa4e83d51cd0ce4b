-- Registers the decision driver as Redis Functions (Redis >= 7). The Rust side puts
-- the library header before the code and replaces VERSION with a hash of it, so
-- that instances running different tollgate versions each call their own code.
redis.register_function{
  function_name = 'tollgate_VERSION',
  callback = function(keys, args) return run_batch(keys, args, false, false) end,
}
redis.register_function{
  function_name = 'tollgate_VERSION_try',
  callback = function(keys, args) return run_try(keys, args, false) end,
}
redis.register_function{
  function_name = 'tollgate_VERSION_charge',
  callback = function(keys, args) return run_try(keys, args, false, true) end,
}
redis.register_function{
  function_name = 'tollgate_VERSION_lease',
  callback = function(keys, args) return run_lease(keys, args, false) end,
}
redis.register_function{
  function_name = 'tollgate_VERSION_ro',
  callback = function(keys, args) return run_batch(keys, args, true, false) end,
  flags = { 'no-writes' },
}
