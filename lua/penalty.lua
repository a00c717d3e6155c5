-- penalty.lua: a global rule's penalty block on one (rule, key), shared by
-- the fleet, and the admin reset of that (rule, key). A node that counts a
-- key's D-th denial blocks it here; every node's lease script sees the block
-- (its KEYS[2]) and leases the key nothing until the block ends.
--
-- KEYS[1]  the (rule, key)'s global state: KEYS[1] of its rate script.
-- KEYS[2]  its block: a string "1" whose TTL is the block's time left;
--          absent: not blocked.
-- ARGV[1]  op: "block"  block the key for ARGV[2] ms; a block in place that
--                       ends later stays as it is;
--              "reset"  forget the key's state (a full bucket, an empty
--                       window) and lift its block: the admin method;
--              "peek"   change nothing.
-- ARGV[2]  block_ms: block: 1 to 2^40; ignored otherwise.
--
-- Writes nothing that depends on time (TTLs are Redis's own), so it needs
-- no TIME and runs on any Redis with PTTL and SET PX (2.6).
--
-- Returns one integer {blocked_ms}: the block's time left after the call, ms
-- (0: not blocked).

-- fail_for and int_arg are lua/common.lua's, which daemon/scripts.cpp prepends
-- to this file.
local fail = fail_for('penalty.lua')
local op = ARGV[1]
if op == 'block' then
  local block_ms = int_arg(2, 1, 2 ^ 40)
  if not block_ms then
    return fail('block needs ARGV[2], block_ms, an integer from 1 to 2^40')
  end
  if redis.call('PTTL', KEYS[2]) < block_ms then
    redis.call('SET', KEYS[2], '1', 'PX', string.format('%d', block_ms))
  end
elseif op == 'reset' then
  redis.call('DEL', KEYS[1], KEYS[2])
elseif op ~= 'peek' then
  return fail('op must be block, reset or peek')
end
return {math.max(redis.call('PTTL', KEYS[2]), 0)}
