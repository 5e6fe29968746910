-- Publishes one message to one topic, atomically (docs/cluster.md); after offset.lua.
-- KEYS[1] the topic's metadata hash (epoch `e`, last offset `s`), KEYS[2] its stream,
-- KEYS[3] (when the publisher sent an Idempotency-Key) the key's record in the topic's slot.
-- ARGV: 1 channel, 2 body, 3 history size, 4 history seconds, 5 a fresh epoch, 6 meta seconds,
-- 7 this server's replication id (`master_replid`, '' if unknown), which the metadata keeps as `r`;
-- 8 the idempotency window in milliseconds (used with KEYS[3]);
-- 9.. (Redis Cluster) the replication ids of the cluster's masters serving slots now.
-- Returns {epoch, offset, nodes that received it, 1 if a repeat of a remembered key else 0}.
if KEYS[3] then
  -- Claimed in the same script as the publish: a node that dies after Redis ran it leaves
  -- the record behind, so the publisher's retry (on any node) is answered the same id and
  -- nothing is delivered twice.
  local prev = redis.call('GET', KEYS[3])
  if prev then
    -- `EPOCH OFFSET`, or a fragment's record (stream.lua) with its stream after: its id.
    local e, o = string.match(prev, '^(%S+) (%d+)')
    return {e, tonumber(o), 0, 1}
  end
end
local epoch, offset = take_offset(KEYS[1], KEYS[2], ARGV[5], ARGV[6], ARGV[7], 9)
if tonumber(ARGV[3]) > 0 then
  -- Entry ids are OFFSET-0, so a resume reads exactly the offsets it missed.
  redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[3], offset .. '-0', 'd', ARGV[2])
  redis.call('EXPIRE', KEYS[2], ARGV[4])
end
if KEYS[3] then
  redis.call('SET', KEYS[3], epoch .. ' ' .. offset, 'PX', ARGV[8])
end
local nodes = redis.call('SPUBLISH', ARGV[1], epoch .. ' ' .. offset .. ' ' .. ARGV[2])
return {epoch, offset, nodes, 0}
