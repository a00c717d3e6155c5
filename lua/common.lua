-- common.lua: the helpers that every script in lua/ shares: error replies,
-- ARGV checks, exact integer division, Redis's clock, and the start of a
-- rate script's call. Not a script by itself: Redis loads each script alone,
-- so daemon/scripts.cpp prepends this file to every script at build time
-- (before lua/rate_lease.lua in token_bucket.lua and gcra.lua). The SHA,
-- SCRIPT LOAD and the NOSCRIPT reload are of the whole text, and the line
-- numbers in Redis's error messages count this file's lines first.
--
-- Defines, each local to the script's chunk (a script may not set globals):
--   MAX_SPAN_US         the longest span of time a script works with
--   fail_for(name)      the script's fail(msg), an error reply naming it
--   int_arg(i, lo, hi)  ARGV[i] as an integer in [lo, hi], or nil
--   idiv(a, b)          floor(a / b), exactly
--   ceil_ms(us)         a wait in µs as whole ms, rounded up
--   time_us()           Redis's clock (TIME), µs
--   rate_call(fail, script)  the checked ARGV of a rate script, its time
--                       and its key's penalty block
-- Pure but for time_us and rate_call, which read Redis; none writes.

-- 2^50 µs (35 years): the longest period, debt or bucket depth a script
-- works with, so that a time near now (2^50.6 µs) plus such a span stays an
-- exact integer below 2^53 in Lua's doubles.
local MAX_SPAN_US = 2 ^ 50

-- fail(msg) for the script `name` (its file, e.g. 'token_bucket.lua'): the
-- error reply 'ERR sluice <name>: <msg>', which the script returns.
local function fail_for(name)
  return function(msg)
    return redis.error_reply('ERR sluice ' .. name .. ': ' .. msg)
  end
end

-- ARGV[i] as an integer within [lo, hi], or nil.
local function int_arg(i, lo, hi)
  local v = tonumber(ARGV[i])
  if v == nil or v ~= math.floor(v) or v < lo or v > hi then return nil end
  return v
end

-- floor(a / b) exactly, for integers 0 <= a < 2^53 and b >= 1.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- A wait in µs as whole ms, rounded up; 0 for waits that are over.
local function ceil_ms(us)
  if us <= 0 then return 0 end
  return idiv(us + 999, 1000)
end

-- Redis's clock (TIME) in µs. Writes after TIME need effects replication,
-- which Redis < 5 does not default to, so it asks for that first.
local function time_us()
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The start of a rate script's call: the ARGV that every rate script takes
-- (token_bucket.lua's ARGV[1..8]), checked in this order before any Redis
-- call, then the time and the key's penalty block; checks of the script's
-- own (token_bucket.lua's rate op) follow. `script` says what it takes:
--   usage      the error when n, need, limit, period_ms, now_us (or burst,
--              when checked) is not an integer in its range
--   max_units  the most n and need may be (the least is 0)
--   max_limit  the most limit may be (the least is 1)
--   burst      true: burst must be an integer in 0 .. MAX_SPAN_US (else it
--              is unused, and unchecked)
--   mark       a return's ARGV[8], required there (the window or the now_ms
--              its lease replied): {max = its most, usage = the error}
--   rate       true: the script has the rate op, which leases as lease does
-- Returns {op, n, need, limit, period_ms, burst, now, mark, blocked_ms}, or
-- nil and the error reply. now is now_us, or Redis's TIME when that is 0;
-- mark is a return's ARGV[8] (else nil); blocked_ms the time left of the
-- key's block (KEYS[2], penalty.lua), ms (0: not blocked, or no KEYS[2]).
-- op is ARGV[1], but 'peek' for a lease (or rate op) that must take nothing
-- and only report:
--  - one run after its deadline (ARGV[8], µs of Redis's clock; 0 or absent:
--    none): the daemon that sent it gave up on it, Redis being frozen or
--    slow with the call in its socket. Granting would take units nobody
--    spends (and, after an outage, would run before that daemon's debit);
--  - one on a blocked key: every node learns of a block from its next
--    lease.
local function rate_call(fail, script)
  local op = ARGV[1]
  local n = int_arg(2, 0, script.max_units)
  local need = int_arg(3, 0, script.max_units)
  local limit = int_arg(4, 1, script.max_limit)
  local period_ms = int_arg(5, 1, MAX_SPAN_US / 1000)
  local burst = int_arg(6, 0, MAX_SPAN_US)
  local now = int_arg(7, 0, 2 ^ 53)
  if not (n and need and limit and period_ms and now) or (script.burst and not burst) then
    return nil, fail(script.usage)
  end
  if op == 'lease' and (need < 1 or need > n) then
    return nil, fail('lease needs 1 <= need <= n')
  end
  local mark = nil
  if op == 'return' and script.mark then
    mark = int_arg(8, 0, script.mark.max)
    if not mark then return nil, fail(script.mark.usage) end
  end
  if now == 0 then now = time_us() end

  local leases = op == 'lease' or (script.rate and op == 'rate')
  local deadline = int_arg(8, 0, 2 ^ 53)
  if leases and deadline and deadline > 0 and now > deadline then op = 'peek' end
  local blocked_ms = 0
  if KEYS[2] then
    blocked_ms = math.max(redis.call('PTTL', KEYS[2]), 0)
    if leases and blocked_ms > 0 then op = 'peek' end
  end
  return {op = op, n = n, need = need, limit = limit, period_ms = period_ms, burst = burst, now = now,
          mark = mark, blocked_ms = blocked_ms}
end
