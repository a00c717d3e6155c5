-- fixed_window.lua: the lease form of the fixed window, the global state of
-- one (rule, key) in Redis. The maths is daemon/algorithms/fixed_window.h in
-- integer microseconds of Redis's clock: leasing one unit at a time admits
-- exactly what fixed_window::acquire admits, with the same remaining,
-- retry_after_ms and reset_after_ms.
--
-- KEYS[1]  the state: a hash {w = window id, n = units counted in it}, where
--          window id = floor(now_us / period_us). An absent key counts 0.
--          A count above `limit` is debt (see "debit"): each window that
--          passes pays `limit` of it off, so the excess is carried into the
--          following windows instead of vanishing at the window's end.
--          A stored window later than now's (Redis's clock stepped back) is
--          used as it is, so nothing is granted twice.
--          Debt is capped: the count never exceeds limit * floor(2^50 /
--          period_us) (nor 2^52), so paying it off takes at most 2^50 µs and
--          every key written gets a valid TTL.
-- KEYS[2]  optional: the key's penalty block (penalty.lua), a string whose
--          TTL is the block's time left. While it exists a lease grants
--          nothing and replies as a peek. Given, the reply gets a sixth
--          integer: the block's time left, ms (0: not blocked).
-- ARGV[1]  op: "lease"  take up to n units when at least `need` are left;
--              "return" give n unused units back to the window they were
--                       leased in, ARGV[8]. Only a return for the stored
--                       window, while it is still the current one, lowers the
--                       count (never below 0); a return for any other window
--                       (one that has ended, whose count the new window does
--                       not include, or one that was never stored) changes
--                       nothing, so units leased by other nodes in a newer
--                       window are never refunded;
--              "debit"  count n units unconditionally: units admitted while
--                       Redis was unreachable;
--              "peek"   take nothing, report the state.
-- ARGV[2]  n: units (lease: at most; return, debit: exactly; peek: ignored).
-- ARGV[3]  need: lease: the fewest units worth granting, 1 <= need <= n;
--          peek: report retry_after_ms for this many units (0 is allowed);
--          debit: how long ago (ms) the units began to be admitted (the
--          start of the fallback span; 0: just now). Only the share of them
--          that falls in the window counting now is counted (spread evenly
--          over the span); those of windows already over weigh nothing.
-- ARGV[4]  limit: units per window, >= 1.
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
-- ARGV[9..] optional: a calendar window (daemon/calendar.h): consecutive
--          windows as triples id, start_us, end_us (Unix µs), which the
--          daemon works out for the zone around its own wall clock (the
--          one before, the one now and the one after). The script uses the
--          one holding now_us instead of floor(now_us / period_us), and
--          never computes a time zone itself; ARGV[8] is then present ("0"
--          where the op takes none). A window later than the last given
--          is taken to last period_ms (the longest such a window lasts),
--          which only the end of a debt that spans several windows uses.
--          Now outside every given window is an error reply.
--
-- Needs Redis >= 5: the script writes after TIME, which takes effects
-- replication (the default from 5.0, the only mode from 7.0); it asks for it
-- with redis.replicate_commands() where that exists. Multi-field HSET needs 4.0.
--
-- Returns five integers {granted, remaining, retry_after_ms, reset_after_ms,
-- now_ms}, and blocked_ms sixth when KEYS[2] is given:
--   granted         units moved into the caller's slice (lease), else 0;
--   remaining       limit - count after this call (0 in debt);
--   retry_after_ms  0 when the lease granted (or a peek of `need` would);
--                   otherwise until the window in which `need` units are
--                   left begins, rounded up; -1 when need > limit;
--   reset_after_ms  until the count (and any debt) is gone, rounded up; 0
--                   when nothing is counted;
--   now_ms          Redis's time (floor of now_us / 1000), for clock offsets.
--
-- The key's TTL is reset_after_ms, so it is at most one period, plus one
-- period per `limit` units of debt, and never above 2^50 µs (rounded up to
-- ms) past the window's start.

-- fail_for, rate_call, int_arg, idiv, ceil_ms and MAX_SPAN_US are
-- lua/common.lua's, which daemon/scripts.cpp prepends to this file.
local fail = fail_for('fixed_window.lua')
local call, err = rate_call(fail, {max_units = 2 ^ 40, max_limit = 2 ^ 40,
  usage = 'ARGV must be op, n, need, limit, period_ms, burst, now_us (integers)',
  mark = {max = 2 ^ 53, usage = 'return needs ARGV[8], the window id the units were leased in'}})
if not call then return err end
local op, n, need, limit, period_ms, now = call.op, call.n, call.need, call.limit, call.period_ms, call.now
local lease_window, blocked_ms = call.mark, call.blocked_ms

local period = period_ms * 1000

-- The windows: by default floor(now / period); a calendar's come in ARGV.
local cal_ids, cal_starts, cal_ends = nil, {}, {}
if ARGV[9] then
  cal_ids = {}
  local i = 9
  while ARGV[i] do
    local id, first, last = int_arg(i, 0, 2 ^ 53), int_arg(i + 1, 0, 2 ^ 53), int_arg(i + 2, 0, 2 ^ 53)
    if not (id and first and last) or last <= first then
      return fail('calendar windows must be id, start_us, end_us triples')
    end
    cal_ids[#cal_ids + 1] = id
    cal_starts[id] = first
    cal_ends[id] = last
    i = i + 3
  end
end

-- The start of window `k` (µs).
local function window_start(k)
  if not cal_ids then return k * period end
  if cal_starts[k] then return cal_starts[k] end
  local last = cal_ids[#cal_ids]
  if k > last then return cal_ends[last] + (k - last - 1) * period end
  return cal_starts[cal_ids[1]] - (cal_ids[1] - k) * period
end

local now_id = nil
if cal_ids then
  for _, id in ipairs(cal_ids) do
    if cal_starts[id] <= now and now < cal_ends[id] then now_id = id end
  end
  if not now_id then return fail('now is in none of the calendar windows given') end
else
  now_id = idiv(now, period)
end
-- The most a count may reach: its debt is paid off within 2^50 µs, and it
-- stays an exact integer (limit * windows may itself pass 2^53).
local max_count = math.min(limit * idiv(MAX_SPAN_US, period), 2 ^ 52)

-- The window this call applies to and its count, debt carried forward.
local id, count = now_id, 0
local current = false  -- whether the stored window is the one that applies
local stored = redis.call('HMGET', KEYS[1], 'w', 'n')
if stored[1] and stored[2] then
  local stored_id, stored_count = tonumber(stored[1]), math.min(tonumber(stored[2]), max_count)
  if stored_id >= now_id then
    id, count, current = stored_id, stored_count, true
  else
    count = math.max(0, stored_count - limit * (now_id - stored_id))
  end
end

-- The start of the window `k` windows after id, as a wait from now in ms.
local function ms_until_window(k)
  return ceil_ms(window_start(id + k) - now)
end

local function store()
  if count == 0 then
    redis.call('DEL', KEYS[1])
  else
    local ttl_ms = ms_until_window(math.ceil(count / limit))
    redis.call('HSET', KEYS[1], 'w', string.format('%d', id), 'n', string.format('%d', count))
    redis.call('PEXPIRE', KEYS[1], ttl_ms)
  end
end

local granted = 0
if op == 'lease' then
  if need <= limit and count + need <= limit then
    granted = math.min(n, limit - count)
    count = count + granted
    store()
  end
elseif op == 'return' then
  if current and lease_window == id and count > 0 and n > 0 then
    count = count - math.min(n, count)
    store()
  end
elseif op == 'debit' then
  local units = n
  if need > 0 then
    local span = need * 1000
    units = math.ceil(n * (math.min(span, math.max(now - window_start(now_id), 0)) / span))
  end
  count = math.min(count + units, max_count)
  store()
elseif op ~= 'peek' then
  return fail('op must be lease, return, debit or peek')
end

local retry_ms = 0
if op == 'lease' or op == 'peek' then
  if need > limit then
    retry_ms = -1
  elseif granted == 0 and count + need > limit then
    -- The first window after id whose carried count leaves `need` units.
    retry_ms = ms_until_window(math.ceil((count + need - limit) / limit))
  end
end
local reset_ms = 0
if count > 0 then reset_ms = ms_until_window(math.ceil(count / limit)) end
local reply = {granted, math.max(0, limit - count), retry_ms, reset_ms, math.floor(now / 1000)}
if KEYS[2] then reply[6] = blocked_ms end
return reply
