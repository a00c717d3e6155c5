-- token_bucket.lua: the lease form of the token bucket, the global state of
-- one (rule, key) in Redis. The maths is daemon/algorithms/token_bucket.h in
-- integer microseconds of Redis's clock: leasing one unit at a time admits
-- exactly what token_bucket::acquire admits, with the same remaining,
-- retry_after_ms and reset_after_ms.
--
-- KEYS[1]  the state: a string holding T, the virtual time (µs, Redis clock)
--          at which the bucket was, or would have been, empty. The bucket
--          holds min(burst, floor((now - T) / interval)) units, interval =
--          ceil(period_us / limit). An absent key is a full bucket.
-- KEYS[2]  optional: the key's penalty block (penalty.lua), a string whose
--          TTL is the block's time left. While it exists a lease grants
--          nothing and replies as a peek. Given, the reply gets a sixth
--          integer: the block's time left, ms (0: not blocked).
-- ARGV[1]  op: "lease"  take up to n units when at least `need` are there;
--              "return" give n unused units back (never beyond a full bucket);
--              "debit"  take n units unconditionally: units admitted while
--                       Redis was unreachable. T may pass now: that is debt,
--                       and the next lease waits until it has refilled;
--              "peek"   take nothing, report the state.
-- ARGV[2]  n: units (lease: at most; return, debit: exactly; peek: ignored).
-- ARGV[3]  need: lease: the fewest units worth granting, 1 <= need <= n;
--          peek: report retry_after_ms for this many units (0 is allowed);
--          debit: how long ago (ms) the units began to be admitted (the
--          start of the fallback span; 0: just now). They are charged as
--          spent over that span, so a fleet that its fallback shares held
--          to the limit leaves the state empty, not in debt for the span.
-- ARGV[4]  limit: units refilled per period, >= 1.
-- ARGV[5]  period_ms: >= 1.
-- ARGV[6]  burst: the bucket's capacity in units, >= 0.
-- ARGV[7]  now_us: "0" reads Redis TIME, which is what the daemon always
--          passes; any other value is the time to use (µs). A test seam only.
-- ARGV[8]  lease: its deadline (µs, Redis clock; 0 or absent: none): run
--          later, the lease grants nothing and replies as a peek. Other
--          ops ignore it (fixed_window's and sliding_window's return take
--          the window there; every rate script takes the same ARGV).
--
-- Needs Redis >= 5: the script writes after TIME, which takes effects
-- replication (the default from 5.0, the only mode from 7.0); it asks for it
-- with redis.replicate_commands() where that exists.
--
-- Returns five integers {granted, remaining, retry_after_ms, reset_after_ms,
-- now_ms}, and blocked_ms sixth when KEYS[2] is given:
--   granted         units moved into the caller's slice (lease), else 0;
--   remaining       whole units left in the bucket after this call;
--   retry_after_ms  0 when the lease granted (or a peek of `need` would);
--                   otherwise until `need` units are in the bucket, rounded
--                   up; -1 when need > burst, which can never be granted;
--   reset_after_ms  until the bucket is full again, rounded up;
--   now_ms          Redis's time (floor of now_us / 1000), for clock offsets.
--
-- The key's TTL is reset_after_ms (the state matters until the bucket is
-- full; a full bucket deletes the key), so it is at most
-- burst * interval + outstanding debt, rounded up to ms.
-- Lua numbers are doubles: every quantity is an integer below 2^53. Times
-- near 2^50.6 µs (now) plus burst * interval <= 2^50 stay exact; debt
-- saturates at 2^50 µs past now.

local MAX_SPAN_US = 2 ^ 50

local function fail(msg)
  return redis.error_reply('ERR sluice token_bucket.lua: ' .. msg)
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

local op = ARGV[1]
local n = int_arg(2, 0, MAX_SPAN_US)
local need = int_arg(3, 0, MAX_SPAN_US)
local limit = int_arg(4, 1, MAX_SPAN_US)
local period_ms = int_arg(5, 1, MAX_SPAN_US / 1000)
local burst = int_arg(6, 0, MAX_SPAN_US)
local now = int_arg(7, 0, 2 ^ 53)
if not (n and need and limit and period_ms and burst and now) then
  return fail('ARGV must be op, n, need, limit, period_ms, burst, now_us (integers)')
end
if op == 'lease' and (need < 1 or need > n) then
  return fail('lease needs 1 <= need <= n')
end
if now == 0 then
  -- Writes after TIME need effects replication (Redis < 5 does not default to it).
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- A lease that runs after its deadline (ARGV[8]) was given up on by the
-- daemon that sent it: Redis was frozen or slow with the call in its socket.
-- Granting would take units nobody spends (and, after an outage, would run
-- before that daemon's debit), so it only reports, as a peek does.
if op == 'lease' then
  local deadline = int_arg(8, 0, 2 ^ 53)
  if deadline and deadline > 0 and now > deadline then op = 'peek' end
end

-- A key its rule's penalty blocked (KEYS[2], penalty.lua) is leased nothing
-- while the block lasts: every node learns of the block from its next lease.
local blocked_ms = 0
if KEYS[2] then
  blocked_ms = math.max(redis.call('PTTL', KEYS[2]), 0)
  if op == 'lease' and blocked_ms > 0 then op = 'peek' end
end

local interval = idiv(period_ms * 1000 + limit - 1, limit)
-- (A debit's `need` is a span of time, not units.)
local need_units = op == 'debit' and 0 or need
if burst * interval > MAX_SPAN_US or n * interval > MAX_SPAN_US or need_units * interval > MAX_SPAN_US then
  return fail('burst * period / limit must stay below 2^50 us')
end
local full = now - burst * interval

-- The empty time as it applies now: anything older than `full` reads as full.
local stored = redis.call('GET', KEYS[1])
local empty = full
if stored then empty = math.max(tonumber(stored), full) end

local function units_at(t)
  if t >= now then return 0 end
  return idiv(now - t, interval)
end

local function store(t)
  if t <= full then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], string.format('%d', t), 'PX', ceil_ms(t - full))
  end
end

local granted = 0
if op == 'lease' then
  if need <= burst and units_at(empty) >= need then
    granted = math.min(n, units_at(empty))
    empty = empty + granted * interval
    store(empty)
  end
elseif op == 'return' then
  if stored then
    empty = tonumber(stored) - n * interval
    store(empty)
    empty = math.max(empty, full)
  end
elseif op == 'debit' then
  if need == 0 then
    -- Admitted just now, beside whatever the state saw: added to it.
    empty = math.min(empty + n * interval, now + MAX_SPAN_US)
  else
    -- Admitted over the last `need` ms, while the node could not reach
    -- Redis: spent from the bucket as it was then, refilled meanwhile. What
    -- the state saw over the same span (nodes that were back sooner) ran
    -- beside it under the same shares, so the later of the two stands, not
    -- their sum. (A node cut off alone while the others leased on is not
    -- charged its share of the span: that share is the overshoot bound.)
    local spent = now - need * 1000 - burst * interval + n * interval
    empty = math.min(math.max(empty, spent), now + MAX_SPAN_US)
  end
  store(empty)
  empty = math.max(empty, full)
elseif op ~= 'peek' then
  return fail('op must be lease, return, debit or peek')
end

local retry_ms = 0
if op == 'lease' or op == 'peek' then
  if need > burst then
    retry_ms = -1
  elseif granted == 0 and units_at(empty) < need then
    retry_ms = ceil_ms(empty + need * interval - now)
  end
end
local reply = {granted, units_at(empty), retry_ms, ceil_ms(empty - full), math.floor(now / 1000)}
if KEYS[2] then reply[6] = blocked_ms end
return reply
