-- heartbeat.lua: fleet membership. Every daemon calls it periodically; the
-- live count N is what the lease path divides global limits by (a node's
-- fair share is global / N).
--
-- KEYS[1]  the members: a sorted set, member = node id, score = the time
--          (µs, Redis clock) at which the member expires unless it beats
--          again. Members with score <= now are removed by every call.
-- ARGV[1]  op: "beat"  this node is alive until now + ttl_ms;
--              "leave" this node is gone (graceful shutdown);
--              "peek"  count only.
-- ARGV[2]  node_id: the caller's node id (any bytes).
-- ARGV[3]  ttl_ms: how long a beat keeps the node counted, >= 1 (the daemon
--          passes a few beat intervals, so one lost beat does not drop it).
-- ARGV[4]  now_us: "0" reads Redis TIME, which is what the daemon always
--          passes; any other value is the time to use (µs). A test seam only.
--
-- Needs Redis >= 5: the script writes after TIME, which takes effects
-- replication (the default from 5.0, the only mode from 7.0); it asks for it
-- with redis.replicate_commands() where that exists.
--
-- Returns two integers {live, now_ms}:
--   live    members alive after this call (this node included after "beat");
--   now_ms  Redis's time (floor of now_us / 1000), for clock offsets.
--
-- The key's TTL is until the last member expires (at most ttl_ms after the
-- latest beat); the key is gone when no member is left.

-- fail_for, int_arg, time_us and ceil_ms are lua/common.lua's, which
-- daemon/scripts.cpp prepends to this file.
local fail = fail_for('heartbeat.lua')
local op = ARGV[1]
local node = ARGV[2]
local ttl_ms = int_arg(3, 1, 2 ^ 40)
local now = int_arg(4, 0, 2 ^ 53)
if not (node and ttl_ms and now) then
  return fail('ARGV must be op, node_id, ttl_ms, now_us')
end
if op ~= 'beat' and op ~= 'leave' and op ~= 'peek' then
  return fail('op must be beat, leave or peek')
end
if now == 0 then now = time_us() end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
if op == 'beat' then
  redis.call('ZADD', KEYS[1], string.format('%d', now + ttl_ms * 1000), node)
elseif op == 'leave' then
  redis.call('ZREM', KEYS[1], node)
end

local live = redis.call('ZCARD', KEYS[1])
if live > 0 and op ~= 'peek' then
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local until_us = tonumber(last[2]) - now
  redis.call('PEXPIRE', KEYS[1], ceil_ms(until_us))
end
return {live, math.floor(now / 1000)}
