-- concurrency.lua: global concurrency leases, the state of one (rule, key) in
-- Redis. At most `limit` units are held across the fleet at once; each node's
-- holding carries a deadline, so the units of a node that crashed (or lost
-- Redis for longer than the lease TTL) come free on their own. A live node
-- renews its deadline with every call.
--
-- KEYS[1]  the state: a hash node id -> "<units>:<deadline_us>" (Redis
--          clock). One key, not a hash plus a sorted set, so the state of a
--          (rule, key) stays one Redis key (one Cluster slot, one name the
--          daemon builds). Entries whose deadline <= now are deleted by
--          every call before it decides; there is one field per node
--          holding units, so a call costs O(nodes).
-- ARGV[1]  op: "lease"  hold up to n more units when at least `need` are
--                       free, and renew this node's deadline;
--              "return" release n of this node's units (all when it holds
--                       fewer), and renew the deadline of what is left;
--              "renew"  move this node's deadline to now + lease_ttl_ms;
--              "peek"   change nothing but the expired entries.
-- ARGV[2]  n: units (lease: at most; return: exactly; renew, peek: ignored).
-- ARGV[3]  need: lease: the fewest units worth granting, 1 <= need <= n;
--          peek: report retry_after_ms for this many units (0 is allowed).
-- ARGV[4]  limit: units held at once across the fleet, >= 1.
-- ARGV[5]  lease_ttl_ms: how long a node's holding lives unless renewed, >= 1.
-- ARGV[6]  node_id: the caller's node id (any bytes).
-- ARGV[7]  now_us: "0" reads Redis TIME, which is what the daemon always
--          passes; any other value is the time to use (µs). A test seam only.
--
-- Needs Redis >= 5: the script writes after TIME, which takes effects
-- replication (the default from 5.0, the only mode from 7.0); it asks for it
-- with redis.replicate_commands() where that exists.
--
-- Returns six integers {granted, remaining, retry_after_ms, reset_after_ms,
-- now_ms, held}:
--   granted         units added to this node's holding (lease), else 0;
--   remaining       units free across the fleet after this call;
--   retry_after_ms  0 when the lease granted (or a peek of `need` would);
--                   otherwise until enough holdings expire for `need` units,
--                   rounded up (returns may free them sooner); -1 when
--                   need > limit;
--   reset_after_ms  until the last holding expires (0 when none is held);
--   now_ms          Redis's time (floor of now_us / 1000), for clock offsets;
--   held            units this node holds after the call (0 after its lease
--                   expired: the node must treat its local units as gone).
--
-- The key's TTL is reset_after_ms: at most lease_ttl_ms after the latest
-- call of any node still holding units.

-- fail_for, int_arg, time_us and ceil_ms are lua/common.lua's, which
-- daemon/scripts.cpp prepends to this file.
local fail = fail_for('concurrency.lua')
local op = ARGV[1]
local n = int_arg(2, 0, 2 ^ 40)
local need = int_arg(3, 0, 2 ^ 40)
local limit = int_arg(4, 1, 2 ^ 40)
local ttl_ms = int_arg(5, 1, 2 ^ 40)
local node = ARGV[6]
local now = int_arg(7, 0, 2 ^ 53)
if not (n and need and limit and ttl_ms and node and now) then
  return fail('ARGV must be op, n, need, limit, lease_ttl_ms, node_id, now_us')
end
if op == 'lease' and (need < 1 or need > n) then
  return fail('lease needs 1 <= need <= n')
end
if op ~= 'lease' and op ~= 'return' and op ~= 'renew' and op ~= 'peek' then
  return fail('op must be lease, return, renew or peek')
end
if now == 0 then now = time_us() end
local deadline = now + ttl_ms * 1000

-- Live holdings of the other nodes, and this node's.
local others = {}  -- {deadline_us, units}
local others_held = 0
local mine, mine_deadline = 0, 0
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local units, until_us = string.match(fields[i + 1], '^(%d+):(%d+)$')
  units, until_us = tonumber(units), tonumber(until_us)
  if units == nil or until_us <= now then
    redis.call('HDEL', KEYS[1], fields[i])
  elseif fields[i] == node then
    mine, mine_deadline = units, until_us
  else
    others[#others + 1] = {until_us, units}
    others_held = others_held + units
  end
end

local function free()
  return math.max(0, limit - others_held - mine)
end

local granted = 0
if op == 'lease' then
  if need <= limit and free() >= need then
    granted = math.min(n, free())
    mine = mine + granted
  end
  if mine > 0 then mine_deadline = deadline end
elseif op == 'return' then
  mine = mine - math.min(n, mine)
  mine_deadline = deadline
elseif op == 'renew' then
  mine_deadline = deadline
end
if op ~= 'peek' then
  if mine > 0 then
    redis.call('HSET', KEYS[1], node, string.format('%d:%d', mine, mine_deadline))
  else
    redis.call('HDEL', KEYS[1], node)
  end
end

local last = now
for _, holding in ipairs(others) do last = math.max(last, holding[1]) end
if mine > 0 then last = math.max(last, mine_deadline) end
if last > now then redis.call('PEXPIRE', KEYS[1], ceil_ms(last - now)) end

local retry_ms = 0
if op == 'lease' or op == 'peek' then
  if need > limit then
    retry_ms = -1
  elseif granted == 0 and free() < need then
    -- Holdings expire soonest first; this node's own count too.
    local expiring = {}
    for _, holding in ipairs(others) do expiring[#expiring + 1] = holding end
    if mine > 0 then expiring[#expiring + 1] = {mine_deadline, mine} end
    table.sort(expiring, function(a, b) return a[1] < b[1] end)
    local held = others_held + mine
    for _, holding in ipairs(expiring) do
      held = held - holding[2]
      if limit - held >= need then
        retry_ms = ceil_ms(holding[1] - now)
        break
      end
    end
  end
end
return {granted, free(), retry_ms, ceil_ms(last - now), math.floor(now / 1000), mine}
