-- sliding_log.lua: the lease form of the sliding-window log, the global state
-- of one (rule, key) in Redis: the sorted set of admission times that the
-- classic ZSET sliding log keeps. The maths is
-- daemon/algorithms/sliding_log.h in integer microseconds of Redis's clock:
-- leasing one unit at a time admits exactly what sliding_log::acquire
-- admits, with the same remaining, retry_after_ms and reset_after_ms.
--
-- A lease adds one entry per granted unit, stamped with Redis's TIME at the
-- lease. The node spends those units later, so the log forgets a unit one
-- period after its lease, not after its spending: a unit spent d after its
-- lease leaves the log d early. The daemon bounds that: a slice's units may
-- be spent until one period after its newest lease (later they would count
-- nowhere), and any window of one period admits at most `limit` plus the
-- units that the fleet held leased and unspent when the window began
-- (docs/design.md, "The sliding log in Redis").
--
-- KEYS[1]  the state: a sorted set, one member per unit in the log, scored
--          by its time (µs, Redis clock); members are "<time>:<n>", n
--          numbering the entries of one time from 1 in ten digits (so that
--          their order as strings, which Redis keeps among equal scores, is
--          their order as numbers, and the last one gives the next n). A
--          unit is in the log while its time > now - period_us, and an
--          entry "in the future" (Redis's clock stepped back) counts until
--          its time + period. At most `limit` entries are kept: only the
--          newest `limit` decide when units come free, so a debit beyond the
--          limit is remembered exactly, as a log full until those entries
--          leave it. An absent key is an empty log.
-- KEYS[2]  optional: the key's penalty block (penalty.lua), a string whose
--          TTL is the block's time left. While it exists a lease grants
--          nothing and replies as a peek. Given, the reply gets a sixth
--          integer: the block's time left, ms (0: not blocked).
-- ARGV[1]  op: "lease"  add up to n units when at least `need` are free;
--              "return" remove n units that a lease added and the node did
--                       not spend (see ARGV[8]);
--              "debit"  add n units unconditionally: units admitted while
--                       Redis was unreachable (see ARGV[3]);
--              "peek"   take nothing, report the state.
-- ARGV[2]  n: units (lease: at most; return, debit: exactly; peek: ignored).
-- ARGV[3]  need: lease: the fewest units worth granting, 1 <= need <= n;
--          peek: report retry_after_ms for this many units (0 is allowed);
--          debit: how long ago (ms) the units began to be admitted (the
--          start of the fallback span; 0: just now). They are logged spread
--          evenly over the span, the last at now (times rounded down to µs),
--          so those admitted more than a period ago weigh nothing.
-- ARGV[4]  limit: units per period, 1 <= limit <= 2^20.
-- ARGV[5]  period_ms: >= 1.
-- ARGV[6]  burst: unused (pass limit); kept so every rate script takes the
--          same ARGV.
-- ARGV[7]  now_us: "0" reads Redis TIME, which is what the daemon always
--          passes; any other value is the time to use (µs). A test seam only.
-- ARGV[8]  lease: its deadline (µs, Redis clock; 0 or absent: none): run
--          later, the lease grants nothing and replies as a peek.
--          Return (required there): the now_ms the granting lease replied.
--          The newest entries of that ms or before that are still in the
--          log are removed, up to n: the lease's own, unless another node
--          leased in the same ms (then as many of its, as new as the lease's).
--
-- Needs Redis >= 5: the script writes after TIME, which takes effects
-- replication (the default from 5.0, the only mode from 7.0); it asks for it
-- with redis.replicate_commands() where that exists.
--
-- Returns five integers {granted, remaining, retry_after_ms, reset_after_ms,
-- now_ms}, and blocked_ms sixth when KEYS[2] is given:
--   granted         units added for the caller's slice (lease), else 0;
--   remaining       limit - units in the log after this call;
--   retry_after_ms  0 when the lease granted (or a peek of `need` would);
--                   otherwise until enough units leave the log for `need`,
--                   rounded up; -1 when need > limit;
--   reset_after_ms  until the newest unit leaves the log, rounded up; 0
--                   when the log is empty;
--   now_ms          Redis's time (floor of now_us / 1000), for clock offsets.
--
-- The key's TTL is reset_after_ms (an empty log deletes the key), so it is
-- at most one period past the newest entry.

-- fail_for, rate_call, ceil_ms and MAX_SPAN_US are lua/common.lua's, which
-- daemon/scripts.cpp prepends to this file.
local fail = fail_for('sliding_log.lua')
local call, err = rate_call(fail, {max_units = MAX_SPAN_US, max_limit = 2 ^ 20,
  usage = 'ARGV must be op, n, need, limit, period_ms, burst, now_us (integers; limit <= 2^20)',
  mark = {max = 2 ^ 53 / 1000, usage = 'return needs ARGV[8]: the now_ms its lease replied'}})
if not call then return err end
local op, n, need, limit, period_ms, now = call.op, call.n, call.need, call.limit, call.period_ms, call.now
local mark_ms, blocked_ms = call.mark, call.blocked_ms
local period = period_ms * 1000
local key = KEYS[1]

local function fmt(v) return string.format('%d', v) end

-- Units that left the log go; a peek leaves the key as it is and counts
-- only what is still in it.
local floor_score = '(' .. fmt(now - period)
local count
if op == 'peek' then
  count = redis.call('ZCOUNT', key, floor_score, '+inf')
else
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - period))
  count = redis.call('ZCARD', key)
end

-- Keeps the newest `limit` entries (more, after a debit or a lower limit,
-- decide nothing).
local function trim()
  if count > limit then
    redis.call('ZREMRANGEBYRANK', key, 0, count - limit - 1)
    count = limit
  end
end
if op ~= 'peek' then trim() end

-- Adds `units` entries at time t, numbered after those of t already there.
local function add(t, units)
  if units <= 0 then return end
  local last = redis.call('ZREVRANGEBYSCORE', key, fmt(t), fmt(t), 'LIMIT', 0, 1)
  local first = 1
  if last[1] then first = tonumber(string.match(last[1], ':(%d+)$')) + 1 end
  local args = {}
  for i = first, first + units - 1 do
    args[#args + 1] = fmt(t)
    args[#args + 1] = string.format('%d:%010d', t, i)
    if #args >= 1000 then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then redis.call('ZADD', key, unpack(args)) end
end

local granted = 0
if op == 'lease' then
  if need <= limit - count then
    granted = math.min(n, limit - count)
    add(now, granted)
    count = count + granted
  end
elseif op == 'return' then
  local upto = fmt(mark_ms * 1000 + 999)
  local gone = redis.call('ZREVRANGEBYSCORE', key, upto, floor_score, 'LIMIT', 0, math.min(n, limit))
  if #gone > 0 then
    redis.call('ZREM', key, unpack(gone))
    count = count - #gone
  end
elseif op == 'debit' then
  local span = math.min(need * 1000, MAX_SPAN_US)
  -- Unit i of n (1..n) was admitted at now - span + floor(i * span / n);
  -- only the newest `limit` of those still in the log are kept.
  local i = n
  local t_run, run = nil, 0
  while i >= 1 and i > n - limit do
    local t = now
    if span > 0 then t = now - math.floor((n - i) * span / n) end
    if t <= now - period then break end
    if t ~= t_run then
      if t_run then add(t_run, run) end
      t_run, run = t, 0
    end
    run = run + 1
    i = i - 1
  end
  if t_run then add(t_run, run) end
  count = redis.call('ZCARD', key)
  trim()
elseif op ~= 'peek' then
  return fail('op must be lease, return, debit or peek')
end

local reset_ms = 0
if count > 0 then
  local newest = redis.call('ZREVRANGEBYSCORE', key, '+inf', floor_score, 'WITHSCORES', 'LIMIT', 0, 1)
  reset_ms = ceil_ms(tonumber(newest[2]) + period - now)
end
if op ~= 'peek' then
  if count == 0 then
    redis.call('DEL', key)
  else
    redis.call('PEXPIRE', key, math.max(reset_ms, 1))
  end
end

local retry_ms = 0
if op == 'lease' or op == 'peek' then
  if need > limit then
    retry_ms = -1
  elseif granted == 0 and limit - count < need then
    -- The (count - (limit - need))-th oldest unit in the log must leave it.
    local k = count - (limit - need)
    local entry = redis.call('ZRANGEBYSCORE', key, floor_score, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
    retry_ms = ceil_ms(tonumber(entry[2]) + period - now)
  end
end
local reply = {granted, limit - count, retry_ms, reset_ms, math.floor(now / 1000)}
if KEYS[2] then reply[6] = blocked_ms end
return reply
