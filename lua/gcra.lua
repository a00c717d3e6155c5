-- gcra.lua: the lease form of GCRA, the global state of one (rule, key) in
-- Redis. The maths is daemon/algorithms/gcra.h in integer microseconds of
-- Redis's clock: leasing one unit at a time admits exactly what gcra::acquire
-- admits, with the same remaining, retry_after_ms and reset_after_ms.
--
-- KEYS[1]  the state: a string holding TAT, the theoretical arrival time (µs,
--          Redis clock). interval = ceil(period_us / limit). c units conform
--          at now when max(TAT, now) + c*interval <= now + burst*interval.
--          An absent key is a fresh key (TAT in the past).
-- KEYS[2]  optional: the key's penalty block (penalty.lua), a string whose
--          TTL is the block's time left. While it exists a lease grants
--          nothing and replies as a peek. Given, the reply gets a sixth
--          integer: the block's time left, ms (0: not blocked).
-- KEYS[3]  optional: the key's rate leases, a hash, as token_bucket.lua's:
--          field "." is the time (µs) up to which the rates held are
--          charged to TAT; each other field is a node, "rate:until_us:demand"
--          (daemon/rate_lease.h). Every op first charges the rates held
--          since "." into TAT, span by span between their ends: a span of dt
--          µs at held rates R moves TAT by ceil(dt * R / limit) and keeps it
--          at or after the span's end, so the cells conform at (limit - R)
--          per period and the cells and the rate holders never pass the
--          limit between them. Rates that ended are dropped. The daemon
--          passes KEYS[3] with every call on a key of a rule that may hold
--          rates (and KEYS[2] then, maybe absent in Redis), so that no call
--          reads TAT uncharged.
--          The bucket cap, as token_bucket.lua's: while rates are held,
--          TAT stays at least their shares of the burst ahead of now,
--          floor(burst * rate / limit) units each (their slices refill to
--          that much: daemon/rate_lease.h, capUnits), so fewer cells
--          conform at once and a pause does not save the burst twice. The
--          floor below is that time (now when no rate is held), span by
--          span as the rates held change; a new rate's share is taken at
--          once (after the rate op's units are).
--          With TAT = T + burst * interval (T: token_bucket.lua's empty
--          time) this script and token_bucket.lua answer every op alike;
--          each keeps its own state's words.
-- ARGV[1]  op: "lease"  take up to n units when at least `need` conform;
--              "return" give n unused units back (TAT moves back, never
--                       before now);
--              "debit"  take n units unconditionally: units admitted while
--                       Redis was unreachable. TAT may pass the tolerance:
--                       that is debt, and the next lease waits for it;
--              "peek"   take nothing, report the state;
--              "rate"   hold a rate (KEYS[2] and KEYS[3] needed), as
--                       token_bucket.lua's rate op: this node's rate lease
--                       is replaced by one of min(n, its max-min fair share
--                       of the limit among the demands recorded, the limit
--                       minus the others' held rates) units per period
--                       until now + lease_ms (n = 0 gives it up), and up to
--                       `need` units are taken as a lease of need 1 would.
-- ARGV[2]  n: units (lease: at most; return, debit: exactly; peek: ignored);
--          rate: the rate asked for, units per period, 0 <= n <= limit.
-- ARGV[3]  need: lease: the fewest units worth granting, 1 <= need <= n;
--          peek: report retry_after_ms for this many units (0 is allowed);
--          debit: how long ago (ms) the units began to be admitted (the
--          start of the fallback span; 0: just now). They are charged as
--          spent over that span, so a fleet that its fallback shares held
--          to the limit leaves the state empty, not in debt for the span;
--          rate: the units to take beside the rate, at most (0: none).
-- ARGV[4]  limit: units per period, >= 1.
-- ARGV[5]  period_ms: >= 1.
-- ARGV[6]  burst: units a fresh key may take at once, >= 0.
-- ARGV[7]  now_us: "0" reads Redis TIME, which is what the daemon always
--          passes; any other value is the time to use (µs). A test seam only.
-- ARGV[8]  lease: its deadline (µs, Redis clock; 0 or absent: none): run
--          later, the lease grants nothing and replies as a peek. Other
--          ops ignore it (fixed_window's and sliding_window's return take
--          the window there; every rate script takes the same ARGV).
--          rate: as for lease (run late, it holds nothing new and replies
--          as a peek, rate 0; the node's earlier rate lease stands).
-- ARGV[9]  rate: the node's id (the field in KEYS[3]).
-- ARGV[10] rate: lease_ms, how long the rate holds, 1 .. 60,000.
--
-- Needs Redis >= 5: the script writes after TIME, which takes effects
-- replication (the default from 5.0, the only mode from 7.0); it asks for it
-- with redis.replicate_commands() where that exists.
--
-- Returns five integers {granted, remaining, retry_after_ms, reset_after_ms,
-- now_ms}, and blocked_ms sixth when KEYS[2] is given, and for a rate op the
-- rate granted seventh (units per period; 0 when it ran as a peek) and
-- `unmet` eighth (as token_bucket.lua's):
--   granted         units moved into the caller's slice (lease, rate), else 0;
--   remaining       whole units that would still conform at once now;
--   retry_after_ms  0 when the lease granted (or a peek of `need` would);
--                   otherwise until `need` units conform, rounded up; -1 when
--                   need > burst, which can never be granted.
--                   A rate op that got neither a rate nor units: until one
--                   unit conforms (-1: burst 0); otherwise 0.
--                   While rates are held (R in all) the cells conform at
--                   (limit - R): the wait at the full rate w becomes
--                   w * limit / (limit - R) in doubles, or, with R = limit,
--                   the time until the first held rate ends plus w;
--   reset_after_ms  until TAT comes to its floor (now, or the held rates'
--                   shares ahead of it), when the key is back to a fresh
--                   burst (less those shares);
--   now_ms          Redis's time (floor of now_us / 1000), for clock offsets;
--   unmet           1 when some node's recorded demand is below its max-min
--                   share of the limit after the call, else 0.
--
-- The key's TTL is reset_after_ms (the state matters until TAT; a TAT at or
-- before now deletes the key), so it is at most burst * interval +
-- outstanding debt, rounded up to ms, plus, while rates are held, the time
-- until the last of them ends (TAT may not come before). KEYS[3]'s TTL is
-- the time until its last entry ends.
-- A rate lease needs limit * 60,000,000 < 2^53 (dt * R stays exact).
-- Lua numbers are doubles: every quantity is an integer below 2^53. Times
-- near 2^50.6 µs (now) plus burst * interval <= 2^50 stay exact; debt
-- saturates at 2^50 µs past now.

local MAX_SPAN_US = 2 ^ 50

local function fail(msg)
  return redis.error_reply('ERR sluice gcra.lua: ' .. msg)
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
local MAX_RATE_LEASE_US = 60000000
local rate_op = op == 'rate'
local node, lease_us
if rate_op then
  node = ARGV[9]
  local lease_ms = int_arg(10, 1, MAX_RATE_LEASE_US / 1000)
  if not (KEYS[2] and KEYS[3]) then return fail('rate needs KEYS[2] and KEYS[3]') end
  if not node or node == '' or not lease_ms then
    return fail('rate needs ARGV[9] node and ARGV[10] lease_ms in 1 .. 60000')
  end
  if n > limit then return fail('rate needs n <= limit') end
  if limit * MAX_RATE_LEASE_US >= 2 ^ 53 then return fail('rate needs limit * 6e7 < 2^53') end
  if burst * limit >= 2 ^ 53 then return fail('rate needs burst * limit < 2^53') end
  lease_us = lease_ms * 1000
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
if op == 'lease' or rate_op then
  local deadline = int_arg(8, 0, 2 ^ 53)
  if deadline and deadline > 0 and now > deadline then op = 'peek' end
end

-- A key its rule's penalty blocked (KEYS[2], penalty.lua) is leased nothing
-- while the block lasts: every node learns of the block from its next lease.
local blocked_ms = 0
if KEYS[2] then
  blocked_ms = math.max(redis.call('PTTL', KEYS[2]), 0)
  if (op == 'lease' or op == 'rate') and blocked_ms > 0 then op = 'peek' end
end

local interval = idiv(period_ms * 1000 + limit - 1, limit)
-- (A debit's `need` is a span of time, not units.)
local need_units = (op == 'debit' or op == 'rate') and 0 or need
if burst * interval > MAX_SPAN_US or n * interval > MAX_SPAN_US or need_units * interval > MAX_SPAN_US then
  return fail('burst * period / limit must stay below 2^50 us')
end
local tolerance_end = now + burst * interval

-- How far (µs) TAT stays ahead of the time while the rates `held` ({node,
-- rate, until_us, demand} each) are held: their shares of the burst.
local function shares_us_of(held)
  local shares = 0
  for _, h in ipairs(held) do
    if h[2] > 0 then shares = shares + idiv(burst * h[2], limit) end
  end
  return math.min(shares, burst) * interval
end

local stored = redis.call('GET', KEYS[1])
if stored then stored = tonumber(stored) end

-- The rates held (KEYS[3]) are charged into TAT up to now, one span between
-- their ends at a time. Within a span at rates R < limit TAT is
-- max(TAT0 + dt * R / limit, t + shares) (shares: the span's, in µs): once
-- at its floor it stays there (a fresh key), as time outruns the charge;
-- with R = limit both move together. So the span's end alone needs the
-- floor, and its start (a TAT already at its floor there would otherwise be
-- charged from an older TAT).
local rates = {}      -- the entries live after now: {node, rate, until_us, demand}
local held_rate = 0   -- the sum of their rates
if KEYS[3] then
  local flat = redis.call('HGETALL', KEYS[3])
  local at = now
  local all = {}
  for i = 1, #flat, 2 do
    if flat[i] == '.' then
      at = math.min(tonumber(flat[i + 1]) or now, now)
    else
      local r, u, d = string.match(flat[i + 1], '^(%d+):(%d+):(%d+)$')
      if r then all[#all + 1] = {flat[i], tonumber(r), tonumber(u), tonumber(d)} end
    end
  end
  local charged = false
  local t = stored
  while at < now do
    local r, span_end, span_held = 0, now, {}
    for _, h in ipairs(all) do
      if h[3] > at and h[2] > 0 then
        r = r + h[2]
        if h[3] < span_end then span_end = h[3] end
        span_held[#span_held + 1] = h
      end
    end
    if r == 0 then break end
    local shares_us = shares_us_of(span_held)
    t = math.max(t or at, at + shares_us)
    t = math.max(t + idiv((span_end - at) * r + limit - 1, limit), span_end + shares_us)
    charged = true
    at = span_end
  end
  if charged then stored = t end
  for _, h in ipairs(all) do
    if h[3] > now then
      rates[#rates + 1] = h
      held_rate = held_rate + h[2]
    end
  end
end

-- TAT as it applies now: a TAT before the floor is a fresh key (with no
-- rate held, the floor is now).
local floor = now + shares_us_of(rates)
local tat = floor
if stored then tat = math.max(stored, floor) end

-- Whole units that fit between `t` and the tolerance edge.
local function units_at(t)
  if t >= tolerance_end then return 0 end
  return idiv(tolerance_end - t, interval)
end

-- The end of the last rate held (now when none): the state lives at least
-- until then, as TAT may not come before.
local function last_rate_end()
  local last = now
  for _, h in ipairs(rates) do
    if h[2] > 0 and h[3] > last then last = h[3] end
  end
  return last
end

local function store(t)
  if t <= floor then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], string.format('%d', t), 'PX', ceil_ms(t - floor) + ceil_ms(last_rate_end() - now))
  end
end

-- Max-min fairness, as token_bucket.lua's: the share of a node asking
-- `mine` among `demands` (its own included) of `capacity`.
local function fair_share(demands, capacity, mine)
  table.sort(demands)
  local left, k = capacity, #demands
  for _, d in ipairs(demands) do
    local split = idiv(left, k)
    if d > split then return math.min(mine, split) end
    left = left - d
    k = k - 1
  end
  return mine
end

local granted = 0
local rate_granted = 0
if op == 'lease' then
  if need <= burst and units_at(tat) >= need then
    granted = math.min(n, units_at(tat))
    tat = tat + granted * interval
    store(tat)
  end
elseif op == 'return' then
  if stored then
    tat = stored - n * interval
    store(tat)
    tat = math.max(tat, floor)
  end
elseif op == 'debit' then
  if need == 0 then
    -- Admitted just now, beside whatever the state saw: added to it.
    tat = math.min(tat + n * interval, now + MAX_SPAN_US)
  else
    -- Admitted over the last `need` ms, while the node could not reach
    -- Redis: the cells spaced on from then. What the state saw over the same
    -- span ran beside them under the same shares, so the later TAT stands,
    -- not their sum (see token_bucket.lua).
    local spent = floor - need * 1000 + n * interval
    tat = math.min(math.max(tat, spent), now + MAX_SPAN_US)
  end
  store(tat)
  tat = math.max(tat, floor)
elseif op == 'rate' then
  local kept, others, demands = {}, 0, {}
  for _, h in ipairs(rates) do
    if h[1] ~= node then
      kept[#kept + 1] = h
      others = others + h[2]
      demands[#demands + 1] = h[4]
    end
  end
  rates = kept
  if n > 0 then
    demands[#demands + 1] = n
    rate_granted = math.max(math.min(fair_share(demands, limit, n), limit - others), 0)
    rates[#rates + 1] = {node, rate_granted, now + lease_us, n}
  end
  held_rate = others + rate_granted
  if need > 0 and burst >= 1 and units_at(tat) >= 1 then
    granted = math.min(need, units_at(tat))
    tat = tat + granted * interval
  end
  -- Then the new rates' shares of the burst are taken: the units just
  -- taken were the state's as the call found it.
  floor = now + shares_us_of(rates)
  tat = math.max(tat, floor)
elseif op ~= 'peek' then
  return fail('op must be lease, return, debit, peek or rate')
end

-- TAT was charged (or a rate changed): both keys are written back.
if KEYS[3] then
  store(tat)
  if #rates == 0 then
    redis.call('DEL', KEYS[3])
  else
    local fields = {'.', string.format('%d', now)}
    local last = now
    for _, h in ipairs(rates) do
      fields[#fields + 1] = h[1]
      fields[#fields + 1] = string.format('%d:%d:%d', h[2], h[3], h[4])
      if h[3] > last then last = h[3] end
    end
    redis.call('DEL', KEYS[3])
    redis.call('HSET', KEYS[3], unpack(fields))
    redis.call('PEXPIRE', KEYS[3], ceil_ms(last - now))
  end
end

local retry_ms = 0
-- A rate op that got neither a rate nor units says when one unit conforms.
local wait_need = op == 'rate' and 1 or need
if op == 'lease' or op == 'peek' or (op == 'rate' and rate_granted == 0 and granted == 0) then
  if wait_need > burst then
    retry_ms = -1
  elseif granted == 0 and units_at(tat) < wait_need then
    local wait_us = tat + wait_need * interval - tolerance_end
    if held_rate >= limit then
      local first_end = nil
      for _, h in ipairs(rates) do
        if h[2] > 0 and (first_end == nil or h[3] < first_end) then first_end = h[3] end
      end
      wait_us = (first_end or now) - now + wait_us
    elseif held_rate > 0 then
      wait_us = math.ceil(wait_us * limit / (limit - held_rate))
    end
    retry_ms = ceil_ms(wait_us)
  end
end
local reply = {granted, units_at(tat), retry_ms, ceil_ms(tat - floor), math.floor(now / 1000)}
if KEYS[2] then reply[6] = blocked_ms end
if rate_op then
  reply[7] = rate_granted
  local all = {}
  for _, h in ipairs(rates) do all[#all + 1] = h[4] end
  local unmet = 0
  for _, h in ipairs(rates) do
    local copy = {}
    for i, d in ipairs(all) do copy[i] = d end
    if h[2] < fair_share(copy, limit, h[4]) then unmet = 1 end
  end
  reply[8] = unmet
end
return reply
