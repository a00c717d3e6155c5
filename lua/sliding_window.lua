-- sliding_window.lua: the lease form of the sliding-window counter, the
-- global state of one (rule, key) in Redis. The maths is
-- daemon/algorithms/sliding_window.h in integer microseconds of Redis's
-- clock: leasing one unit at a time admits exactly what
-- sliding_window::acquire admits, with the same remaining, retry_after_ms and
-- reset_after_ms.
--
--   estimate(now) = prev * (period - elapsed) / period + cur
--
-- where elapsed = now - start of the current window; c units pass when
-- estimate + c <= limit, compared exactly in integers.
--
-- KEYS[1]  the state: a hash {w = window id, c = cur, p = prev}, where window
--          id = floor(now_us / period_us), cur the units counted in window w
--          and prev those in window w - 1. An absent key counts 0.
--          A cur above `limit` is debt (see "debit"): moving on by one
--          window makes prev = min(cur, limit) and cur = cur - limit, so the
--          excess is carried into the following windows instead of
--          vanishing. A stored window later than now's (Redis's clock
--          stepped back) is judged as at its start, where the estimate is
--          largest, so nothing is granted twice.
--          Debt is capped: cur never exceeds limit * floor(2^50 / period_us)
--          (nor 2^52), so paying it off takes at most 2^50 µs and every key
--          written gets a valid TTL.
-- KEYS[2]  optional: the key's penalty block (penalty.lua), a string whose
--          TTL is the block's time left. While it exists a lease grants
--          nothing and replies as a peek. Given, the reply gets a sixth
--          integer: the block's time left, ms (0: not blocked).
-- ARGV[1]  op: "lease"  take up to n units when at least `need` fit;
--              "return" give n unused units back to the window they were
--                       leased in, ARGV[8]: units of the current window come
--                       off cur, units of the previous window off prev (which
--                       is where they are counted now), each never below 0;
--                       a return for any older window (or one never stored)
--                       changes nothing, so units other nodes leased in a
--                       newer window are never refunded;
--              "debit"  count n units unconditionally: units admitted while
--                       Redis was unreachable;
--              "peek"   take nothing, report the state.
-- ARGV[2]  n: units (lease: at most; return, debit: exactly; peek: ignored).
-- ARGV[3]  need: lease: the fewest units worth granting, 1 <= need <= n;
--          peek: report retry_after_ms for this many units (0 is allowed);
--          debit: how long ago (ms) the units began to be admitted (the
--          start of the fallback span; 0: just now). Only the share of them
--          that falls in the sliding period ending now is counted (spread evenly
--          over the span); those of windows already over weigh nothing.
-- ARGV[4]  limit: units per sliding period, 1 <= limit < 2^26.
-- ARGV[5]  period_ms: the window's length, >= 1.
-- ARGV[6]  burst: unused (pass limit); kept so every rate script takes the
--          same ARGV.
-- ARGV[7]  now_us: "0" reads Redis TIME, which is what the daemon always
--          passes; any other value is the time to use (µs). A test seam only.
-- ARGV[8]  lease: its deadline (µs, Redis clock; 0 or absent: none): run
--          later, the lease grants nothing and replies as a peek.
--          Return (required there): the window: the id of
--          the window the returned units were leased in, floor(now_ms /
--          period_ms) of the now_ms that the granting lease replied (the
--          lease counted them in exactly that window: period_us is a whole
--          number of ms). Units leased in different windows are returned
--          with one call per window. If Redis's clock had stepped back, the
--          lease may have counted them in a later stored window; such a
--          return is ignored, which errs towards admitting less.
--
-- Needs Redis >= 5: the script writes after TIME, which takes effects
-- replication (the default from 5.0, the only mode from 7.0); it asks for it
-- with redis.replicate_commands() where that exists. Multi-field HSET needs 4.0.
--
-- Returns five integers {granted, remaining, retry_after_ms, reset_after_ms,
-- now_ms}, and blocked_ms sixth when KEYS[2] is given:
--   granted         units moved into the caller's slice (lease), else 0;
--   remaining       floor(limit - estimate) after this call (0 in debt);
--   retry_after_ms  0 when the lease granted (or a peek of `need` would);
--                   otherwise the first time `need` units fit (the estimate
--                   only falls while nothing is taken), rounded up; -1 when
--                   need > limit;
--   reset_after_ms  until the estimate is 0: the end of the next window when
--                   cur > 0 (plus a window per `limit` units of debt), else
--                   the end of this window when prev > 0, else 0;
--   now_ms          Redis's time (floor of now_us / 1000), for clock offsets.
--
-- The key's TTL is reset_after_ms, so it is at most two periods, plus one
-- period per `limit` units of debt, and never above 2^50 µs + one period
-- (rounded up to ms) past the window's start.
-- Lua numbers are doubles, and units * period_us can pass 2^53 (2^20 units
-- per day is 2^56), so those products are compared as two 26-bit limbs
-- (wide() below); limit < 2^26 keeps every limb exact.

-- fail_for, rate_call, idiv, ceil_ms and MAX_SPAN_US are lua/common.lua's,
-- which daemon/scripts.cpp prepends to this file.

local LIMB = 2 ^ 26

-- units * t as {high, low} with low < 2^26, exact for 0 <= units <= 2^26 and
-- 0 <= t < 2^53.
local function wide(units, t)
  local t_high = math.floor(t / LIMB)
  local high = units * t_high
  local low = units * (t - t_high * LIMB)
  local carry = math.floor(low / LIMB)
  return high + carry, low - carry * LIMB
end

-- a_units * a_t <= b_units * b_t, exactly.
local function wide_le(a_units, a_t, b_units, b_t)
  local ah, al = wide(a_units, a_t)
  local bh, bl = wide(b_units, b_t)
  return ah < bh or (ah == bh and al <= bl)
end

-- ceil(units * t / period) exactly, for 0 <= t <= period.
local function ceil_fraction(units, t, period)
  local q = math.ceil(units * t / period)
  if q > 0 and wide_le(units, t, q - 1, period) then q = q - 1 end
  if not wide_le(units, t, q, period) then q = q + 1 end
  return q
end

local fail = fail_for('sliding_window.lua')
local call, err = rate_call(fail, {max_units = 2 ^ 40, max_limit = LIMB - 1,
  usage = 'ARGV must be op, n, need, limit (< 2^26), period_ms, burst, now_us (integers)',
  mark = {max = 2 ^ 53, usage = 'return needs ARGV[8], the window id the units were leased in'}})
if not call then return err end
local op, n, need, limit, period_ms, now = call.op, call.n, call.need, call.limit, call.period_ms, call.now
local lease_window, blocked_ms = call.mark, call.blocked_ms

local period = period_ms * 1000
local now_id = idiv(now, period)
-- The most cur may reach: its debt is paid off within 2^50 µs, and it stays
-- an exact integer (limit * windows may itself pass 2^53).
local max_cur = math.min(limit * idiv(MAX_SPAN_US, period), 2 ^ 52)

-- The count of a window `k` >= 1 windows after one that counted `cur`, and
-- that window's prev: debt is paid off `limit` per window.
local function carried(cur, k)
  return math.max(0, cur - limit * k), math.min(limit, math.max(0, cur - limit * (k - 1)))
end

-- The window this call applies to, its counts and the time it is judged at.
-- A return applies to the stored counts before they are carried forward:
-- units of window w come off c, units of window w - 1 off p, and only while
-- that window is the current or the previous one at the time that applies.
local id, cur, prev, at = now_id, 0, 0, now
local returned = false
local stored = redis.call('HMGET', KEYS[1], 'w', 'c', 'p')
if stored[1] and stored[2] and stored[3] then
  local stored_id = tonumber(stored[1])
  local stored_cur, stored_prev = math.min(tonumber(stored[2]), max_cur), tonumber(stored[3])
  if lease_window and n > 0 and lease_window >= math.max(stored_id, now_id) - 1 then
    if lease_window == stored_id and stored_cur > 0 then
      stored_cur = stored_cur - math.min(n, stored_cur)
      returned = true
    elseif lease_window == stored_id - 1 and stored_prev > 0 then
      stored_prev = stored_prev - math.min(n, stored_prev)
      returned = true
    end
  end
  if stored_id == now_id then
    cur, prev = stored_cur, stored_prev
  elseif stored_id > now_id then
    id, cur, prev, at = stored_id, stored_cur, stored_prev, stored_id * period
  else
    cur, prev = carried(stored_cur, now_id - stored_id)
  end
end
local start = id * period
local elapsed = at - start

-- Whether `units` more fit at `at`: prev * (period - elapsed) + (cur + units)
-- * period <= limit * period.
local function fits(units)
  local budget = limit - cur - units
  return budget >= 0 and wide_le(prev, period - elapsed, budget, period)
end

-- The first offset e in [0, period] into a window whose prev is `p` at which
-- p * (period - e) <= budget * period (budget >= 0).
local function first_fit_offset(p, budget)
  if budget >= p then return 0 end
  -- floor(budget * period / p) exactly, as budget * floor(period / p) plus
  -- the remainder's share; every product stays below 2^53.
  local whole = idiv(period, p)
  local allowed = budget * whole + idiv(budget * (period - whole * p), p)
  return period - allowed
end

local function reset_ms()
  if cur > 0 then return ceil_ms(start + (math.ceil(cur / limit) + 1) * period - now) end
  if prev > 0 then return ceil_ms(start + period - now) end
  return 0
end

local function store()
  if cur == 0 and prev == 0 then
    redis.call('DEL', KEYS[1])
  else
    local ttl_ms = reset_ms()
    redis.call('HSET', KEYS[1], 'w', string.format('%d', id), 'c', string.format('%d', cur),
      'p', string.format('%d', prev))
    redis.call('PEXPIRE', KEYS[1], ttl_ms)
  end
end

local granted = 0
if op == 'lease' then
  if need <= limit and fits(need) then
    -- The largest grant that fits: everything the estimate leaves.
    granted = math.min(n, limit - cur - ceil_fraction(prev, period - elapsed, period))
    cur = cur + granted
    store()
  end
elseif op == 'return' then
  if returned then store() end
elseif op == 'debit' then
  local units = n
  if need > 0 then
    local span = need * 1000
    units = math.ceil(n * (math.min(span, period) / span))
  end
  cur = math.min(cur + units, max_cur)
  store()
elseif op ~= 'peek' then
  return fail('op must be lease, return, debit or peek')
end

local retry_ms = 0
if op == 'lease' or op == 'peek' then
  if need > limit then
    retry_ms = -1
  elseif granted == 0 and not fits(need) then
    -- The first window whose carried cur leaves room for `need`, then the
    -- moment in it at which its prev has decayed enough.
    local k = math.max(0, math.ceil((cur + need - limit) / limit))
    local cur_k, prev_k = cur, prev
    if k > 0 then cur_k, prev_k = carried(cur, k) end
    retry_ms = ceil_ms(start + k * period + first_fit_offset(prev_k, limit - cur_k - need) - now)
  end
end
local remaining = math.max(0, limit - cur - ceil_fraction(prev, period - elapsed, period))
local reply = {granted, remaining, retry_ms, reset_ms(), math.floor(now / 1000)}
if KEYS[2] then reply[6] = blocked_ms end
return reply
