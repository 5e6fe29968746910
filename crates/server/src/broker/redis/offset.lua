-- Takes a topic's next offset (docs/cluster.md): the first part of the publish script
-- (script.lua) and of the appendable-message script (stream.lua), which Rust joins to each.
-- meta_key: the topic's metadata hash (epoch `e`, last offset `s`, replication id `r`);
-- stream_key: its history stream; fresh: a new epoch; meta_ttl: seconds the metadata lives;
-- replid: this server's replication id (`master_replid`, '' if unknown); masters_from: where
-- in ARGV the replication ids of the cluster's masters serving slots now begin (Redis Cluster).
-- Returns the epoch and the offset taken.
local function take_offset(meta_key, stream_key, fresh, meta_ttl, replid, masters_from)
  local meta = redis.call('HMGET', meta_key, 'e', 'r')
  local epoch = meta[1]
  local function current_master(r)
    for i = masters_from, #ARGV do
      if ARGV[i] == r then return true end
    end
    return false
  end
  -- Keys a resharding moved here from another master that still serves slots keep its id: the
  -- migration copied them whole, so their history goes on (rewritten to this server's id below).
  if epoch and replid ~= '' and meta[2] and meta[2] ~= replid and not current_master(meta[2]) then
    -- Written under another replication history: this server was promoted (a failover) or
    -- restarted. Asynchronous replication may have lost the last offsets handed out there, and
    -- an offset must never name two messages: a new epoch, announced as a gap.
    epoch = false
  end
  if not epoch then
    -- A new history: whatever stream a lost or expired epoch left behind is not part of it,
    -- nor are the holes its folded streams left (`f:`, same slot: stream.lua).
    epoch = fresh
    redis.call('DEL', stream_key, (string.gsub(stream_key, '}:s:', '}:f:', 1)))
    redis.call('HSET', meta_key, 'e', epoch, 's', 0)
  end
  if replid ~= '' and meta[2] ~= replid then
    redis.call('HSET', meta_key, 'r', replid)
  end
  local offset = redis.call('HINCRBY', meta_key, 's', 1)
  redis.call('EXPIRE', meta_key, meta_ttl)
  return epoch, offset
end
