-- rate_lease.lua: the maths that token_bucket.lua and gcra.lua share, one
-- function that runs either script's ops on the token bucket's empty time T.
-- Not a script by itself: Redis loads each script alone, so daemon/scripts.cpp
-- prepends this file to both at build time, after lua/common.lua, whose
-- helpers it uses (the SHA, SCRIPT LOAD and the NOSCRIPT reload are of the
-- whole text), and each script's last line calls rate_lease. KEYS, ARGV, the
-- reply, units and TTLs are token_bucket.lua's contract; gcra.lua states how
-- TAT maps onto T. daemon/rate_lease.h is the C++ twin, cross-tested against
-- both scripts on a real Redis.
--
-- rate_lease(script) takes script.name (the file, for error replies),
-- script.state (the state's word in them: "T" or "TAT") and
-- script.state_is_tat (true: KEYS[1] holds TAT = T + burst * interval).

local function rate_lease(script)
  local fail = fail_for(script.name)
  local call, err = rate_call(fail, {max_units = MAX_SPAN_US, max_limit = MAX_SPAN_US, burst = true, rate = true,
    usage = 'ARGV must be op, n, need, limit, period_ms, burst, now_us (integers)'})
  if not call then return err end
  local op, n, need, limit, period_ms, burst, now = call.op, call.n, call.need, call.limit, call.period_ms,
    call.burst, call.now
  local blocked_ms = call.blocked_ms
  local MAX_RATE_LEASE_US = 60000000
  -- A rate op asked for (op says 'peek' for one run late or on a blocked key).
  local rate_op = ARGV[1] == 'rate'
  local node, lease_us
  if rate_op then
    node = ARGV[9]
    local lease_ms = int_arg(10, 1, MAX_RATE_LEASE_US / 1000)
    if not node or node == '' or not lease_ms then
      return fail('rate needs ARGV[9] node and ARGV[10] lease_ms in 1 .. 60000')
    end
    if n > limit then return fail('rate needs n <= limit') end
    if limit * MAX_RATE_LEASE_US >= 2 ^ 53 then return fail('rate needs limit * 6e7 < 2^53') end
    if burst * limit >= 2 ^ 53 then return fail('rate needs burst * limit < 2^53') end
    lease_us = lease_ms * 1000
  end

  local interval = idiv(period_ms * 1000 + limit - 1, limit)
  -- (A debit's `need` is a span of time, not units.)
  local need_units = (op == 'debit' or op == 'rate') and 0 or need
  if burst * interval > MAX_SPAN_US or n * interval > MAX_SPAN_US or need_units * interval > MAX_SPAN_US then
    return fail('burst * period / limit must stay below 2^50 us')
  end
  -- The bucket's cap while the rates `held` ({node, rate, until_us, demand}
  -- each) are held, in µs of refill: burst less their shares of it.
  local function cap_us_of(held)
    local cap = burst
    for _, h in ipairs(held) do
      if h[2] > 0 then cap = cap - idiv(burst * h[2], limit) end
    end
    return math.max(cap, 0) * interval
  end

  -- The script works on T, the token bucket's empty time; a script whose
  -- state is T + burst * interval (gcra.lua's TAT) reads and writes that.
  local state_offset = script.state_is_tat and burst * interval or 0

  -- The state: T (or TAT) alone, or with the rates held (see KEYS[1]).
  local stored = redis.call('GET', KEYS[1])
  local all = {}      -- every rate entry read: {node, rate, until_us, demand}
  local at = now      -- the rates are charged up to here
  if stored and (string.byte(stored, 1) or 0) >= 0x80 then
    local v = cmsgpack.unpack(stored)
    if type(v) ~= 'table' or type(v[1]) ~= 'number' or type(v[2]) ~= 'number' then
      return fail('KEYS[1] holds neither ' .. script.state .. ' nor ' .. script.state .. ' and rates')
    end
    at = math.min(v[2], now)
    for i = 3, #v - 3, 4 do all[#all + 1] = {tostring(v[i]), v[i + 1], v[i + 2], v[i + 3]} end
    stored = v[1] ~= 0 and v[1] - state_offset or nil
  elseif stored then
    stored = tonumber(stored) - state_offset
  end

  -- The rates held are charged into T up to now, one span between
  -- their ends at a time. Within a span at rates R < limit the bucket is
  -- max(T0 + dt * R / limit, t - cap) (cap: the span's, in µs): once full it stays full,
  -- as the uncharged refill outruns the charge; with R = limit both move
  -- together. So the span's end alone needs the cap, and its start (a bucket
  -- already full there would otherwise be charged from an older T).
  -- T (nil: full at `from`) charged with the rates of `entries` over [from,
  -- to]; and whether any was held then.
  local function charge(t, from, to, entries)
    local charged = false
    while from < to do
      local r, span_end, span_held = 0, to, {}
      for _, h in ipairs(entries) do
        if h[3] > from and h[2] > 0 then
          r = r + h[2]
          if h[3] < span_end then span_end = h[3] end
          span_held[#span_held + 1] = h
        end
      end
      if r == 0 then break end
      local cap_us = cap_us_of(span_held)
      t = math.max(t or (from - cap_us), from - cap_us)
      t = math.max(t + idiv((span_end - from) * r + limit - 1, limit), span_end - cap_us)
      charged = true
      from = span_end
    end
    return t, charged
  end
  local rates = {}  -- the entries live after now: {node, rate, until_us, demand}
  if #all > 0 then
    local t, charged = charge(stored, at, now, all)
    if charged then stored = t end
    for _, h in ipairs(all) do
      if h[3] > now then rates[#rates + 1] = h end
    end
  end

  -- The empty time as it applies now: anything older than `full` reads as full.
  local full = now - cap_us_of(rates)
  local empty = full
  if stored then empty = math.max(stored, full) end

  local function units_at(t)
    if t >= now then return 0 end
    return idiv(now - t, interval)
  end

  -- The end of the last rate held (now when none): the bucket's state lives
  -- at least until then, as it may not refill before.
  local function last_rate_end()
    local last = now
    for _, h in ipairs(rates) do
      if h[2] > 0 and h[3] > last then last = h[3] end
    end
    return last
  end

  -- Writes T back (as T + state_offset; and the rates live after now,
  -- charged up to now): alone as its digits, deleted once full; with rates
  -- as their array (KEYS[1]).
  local function store(t)
    if #rates == 0 then
      if t <= full then
        redis.call('DEL', KEYS[1])
      else
        redis.call('SET', KEYS[1], string.format('%d', t + state_offset), 'PX', ceil_ms(t - full))
      end
      return
    end
    local v = {t > full and t + state_offset or 0, now}
    local last = now
    for i, h in ipairs(rates) do
      for j = 1, 4 do v[2 + 4 * (i - 1) + j] = h[j] end
      if h[3] > last then last = h[3] end
    end
    local ttl_ms = math.max(ceil_ms(math.max(t - full, 0)) + ceil_ms(last_rate_end() - now), ceil_ms(last - now), 1)
    redis.call('SET', KEYS[1], cmsgpack.pack(v), 'PX', string.format('%d', ttl_ms))
  end

  -- Whether a rate (or share) `rate` moving by `by` moves past the noise of
  -- the demand measurements behind the asks: by more than an eighth of
  -- itself, or by a 32nd of the limit or more (daemon/rate_lease.h,
  -- pastNoise). Within it, no holder is told to renew early.
  local function past_noise(rate, by)
    return by > 0 and (8 * by > rate or 32 * by >= limit)
  end

  -- Max-min fairness: the share of a node asking `mine` among `demands` (its
  -- own included) of `capacity`: demands are met smallest first while an equal
  -- split of what is left covers them; the rest get that split (floored).
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
  local held_before = 0  -- a rate op: the rate the node held before it
  local fair = 0         -- a rate op: the node's max-min share of the limit
  if op == 'lease' then
    if need <= burst and units_at(empty) >= need then
      granted = math.min(n, units_at(empty))
      empty = empty + granted * interval
      store(empty)
    end
  elseif op == 'return' then
    if stored then
      empty = stored - n * interval
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
      local spent = full - need * 1000 + n * interval
      empty = math.min(math.max(empty, spent), now + MAX_SPAN_US)
    end
    store(empty)
    empty = math.max(empty, full)
  elseif op == 'rate' then
    local kept, others, demands = {}, 0, {}
    for _, h in ipairs(rates) do
      if h[1] == node then held_before = h[2] end
      if h[1] ~= node then
        kept[#kept + 1] = h
        others = others + h[2]
        demands[#demands + 1] = h[4]
      end
    end
    rates = kept
    if n > 0 then
      demands[#demands + 1] = n
      fair = fair_share(demands, limit, n)
      rate_granted = math.max(math.min(fair, limit - others), 0)
      rates[#rates + 1] = {node, rate_granted, now + lease_us, n}
    end
    if need > 0 and burst >= 1 and units_at(empty) >= 1 then
      granted = math.min(need, units_at(empty))
      empty = empty + granted * interval
    end
    -- Then the new rates' shares of the burst leave the bucket: the tokens
    -- just taken were the bucket's as the call found it.
    full = now - cap_us_of(rates)
    empty = math.max(empty, full)
  elseif op ~= 'peek' then
    return fail('op must be lease, return, debit, peek or rate')
  end

  -- A rate op (its tokens, its rate), or rates read (T charged, ended ones
  -- dropped) or held now: written back.
  if rate_op or #all > 0 or #rates > 0 then store(empty) end

  local retry_ms = 0
  -- A rate op that got neither a rate nor tokens says when one token is there.
  local wait_need = op == 'rate' and 1 or need
  if op == 'lease' or op == 'peek' or (op == 'rate' and rate_granted == 0 and granted == 0) then
    if wait_need > burst then
      retry_ms = -1
    elseif granted == 0 and units_at(empty) < wait_need then
      -- The wait starts now, or, while the bucket's cap is below wait_need
      -- (the holders keep their shares of the burst), at the first end of a
      -- held rate after which it is not, with T charged until then.
      local from, t, live = now, empty, rates
      if cap_us_of(rates) < wait_need * interval then
        local ends = {}
        for _, h in ipairs(rates) do
          if h[2] > 0 then ends[#ends + 1] = h[3] end
        end
        table.sort(ends)
        for _, e in ipairs(ends) do
          local after = {}
          for _, h in ipairs(rates) do
            if h[3] > e then after[#after + 1] = h end
          end
          if cap_us_of(after) >= wait_need * interval then
            from, t, live = e, charge(empty, now, e, rates), after
            break
          end
        end
      end
      local wait_us = t + wait_need * interval - from
      local live_rate, first_end = 0, nil
      for _, h in ipairs(live) do
        live_rate = live_rate + h[2]
        if h[2] > 0 and (first_end == nil or h[3] < first_end) then first_end = h[3] end
      end
      if live_rate >= limit then
        wait_us = (first_end or from) - from + wait_us
      elseif live_rate > 0 then
        wait_us = math.ceil(wait_us * limit / (limit - live_rate))
      end
      retry_ms = ceil_ms(from - now + wait_us)
    end
  end
  local reply = {granted, units_at(empty), retry_ms, ceil_ms(empty - full), math.floor(now / 1000)}
  if KEYS[2] or rate_op then reply[6] = blocked_ms end
  if rate_op then
    reply[7] = rate_granted
    local all = {}
    for _, h in ipairs(rates) do all[#all + 1] = h[4] end
    local unmet = 0
    for _, h in ipairs(rates) do
      local copy = {}
      for i, d in ipairs(all) do copy[i] = d end
      local share = fair_share(copy, limit, h[4])
      if past_noise(share, share - h[2]) then unmet = 1 end
    end
    reply[8] = unmet
    -- The other holders learn of a change in the division only by asking,
    -- so every daemon hears the state key's name on <key_prefix>v<V>:renew
    -- and its holder of a rate on the key renews at once
    -- (daemon/redis_keys.h, redisRenewChannel) when either
    --  - rate was freed (past its noise) while another holder is short of
    --    its ask, or
    --  - the node got less than 3/4 of its share because the others hold
    --    more than theirs (a node that starts beside a holder of the whole
    --    limit, which would keep it until its own renewal, seconds away).
    --    Below 3/4, not below the share: demands move between renewals, so
    --    holders stand a little above their shares all the time.
    -- pcall: a user whose ACL forbids the channel loses the speed-up, not
    -- the op.
    local renew = 4 * rate_granted < 3 * fair
    if past_noise(held_before, held_before - rate_granted) then
      for _, h in ipairs(rates) do
        if h[1] ~= node and h[2] < h[4] and h[2] < limit then renew = true end
      end
    end
    local at = string.find(KEYS[1], 'q:{', 1, true)
    if renew and at then redis.pcall('PUBLISH', string.sub(KEYS[1], 1, at - 1) .. 'renew', KEYS[1]) end
  end
  return reply
end
