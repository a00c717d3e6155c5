-- fleet_version.lua: the fleet marker, the state version that the daemons
-- leasing on one key_prefix write (daemon/redis_keys.h). Every daemon calls
-- it before its breaker closes and then every heartbeat interval; a daemon
-- whose version is not the marker's leases nothing (docs/operations.md,
-- "Upgrading the Redis state").
--
-- KEYS[1]  the marker: a string, the version in decimal.
-- ARGV[1]  op: "claim"  set the marker to ARGV[2] with a TTL of ttl_ms when
--                       it is absent, holds no version, or already holds
--                       ARGV[2] (a refresh); otherwise change nothing.
--              "peek"   change nothing.
-- ARGV[2]  version: the caller's state version, an integer >= 1.
-- ARGV[3]  ttl_ms: how long a claim keeps the marker, >= 1 (the daemon
--          passes the members' TTL, so the marker outlives the last
--          heartbeat of its version by at most that).
--
-- Returns one integer {fleet}: the marker's version after the call; 0 when
-- it is absent (a peek) or holds something that is not a version.
--
-- No TIME: the TTL is relative, so the script is deterministic.

-- fail_for and int_arg are lua/common.lua's, which daemon/scripts.cpp prepends
-- to this file.
local fail = fail_for('fleet_version.lua')
local op = ARGV[1]
local version = int_arg(2, 1, 2 ^ 31)
local ttl_ms = int_arg(3, 1, 2 ^ 40)
if not (version and ttl_ms) then
  return fail('ARGV must be op, version, ttl_ms')
end
if op ~= 'claim' and op ~= 'peek' then
  return fail('op must be claim or peek')
end

local stored = redis.call('GET', KEYS[1])
local fleet = 0
if stored then
  fleet = tonumber(stored) or 0
  if fleet ~= math.floor(fleet) or fleet < 1 or fleet > 2 ^ 31 then fleet = 0 end
end
if op == 'claim' and (fleet == 0 or fleet == version) then
  redis.call('SET', KEYS[1], string.format('%d', version), 'PX', string.format('%d', ttl_ms))
  fleet = version
end
return {fleet}
