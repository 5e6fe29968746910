-- Cluster-wide topic occupancy for webhooks (docs/hooks.md). KEYS[1]: the topic's set of
-- nodes holding subscribers. ARGV[1]: this node; ARGV[2]: "1" joined, "0" left; ARGV[3]: the
-- prefix of the nodes' liveness keys. Members whose liveness key expired (a node that died)
-- are removed first. Returns 1 when the cluster made the transition now (the set went from
-- empty to this node, or from this node to empty), so exactly one node reports it.
for _, n in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if n ~= ARGV[1] and redis.call('EXISTS', ARGV[3] .. n) == 0 then
    redis.call('SREM', KEYS[1], n)
  end
end
if ARGV[2] == '1' then
  local added = redis.call('SADD', KEYS[1], ARGV[1])
  if added == 1 and redis.call('SCARD', KEYS[1]) == 1 then
    return 1
  end
  return 0
end
local removed = redis.call('SREM', KEYS[1], ARGV[1])
if removed == 1 and redis.call('SCARD', KEYS[1]) == 0 then
  return 1
end
return 0
