-- Appendable messages across the cluster (docs/cluster.md, "Appendable messages"); after
-- offset.lua. One call opens a stream, appends to one, or closes a partition's stale ones. A
-- fragment is checked against its stream's state and limits, takes the topic's next offset, is
-- published live as an `append` event, and moves the stream's ONE folded entry in history (the
-- text so far), all in one script: every node sees the same stream, whichever node took it.
-- KEYS[1] the partition's open streams: a sorted set of `ID TOPIC` by last fragment time (ms);
-- KEYS[2] (open or append with an Idempotency-Key) the key's record, as script.lua's: checked
-- and written in this script with the fragment, so a node dying after Redis ran it leaves the
-- record for the publisher's retry on any node. It holds `EPOCH OFFSET STREAM SEQ DONE`.
-- Keys of the topic, in the same slot (the partition's hash tag): `m:`/`s:` as script.lua,
-- `o:TOPIC` its open stream ids (sorted by last fragment time), `f:TOPIC` the offsets whose
-- folded entries moved on (the holes in its history stream), `a:LEN:TOPIC:ID` a stream's state
-- (`t` text so far, `q` fragments, `h`/`he` offset and epoch of its folded entry, `c` closed).
-- ARGV: 1 'open' | 'append' | 'sweep', 2 the partition's key prefix `clarion:{pN}:`, 3 topic,
-- 4 stream id (append), 5 fragment, 6 done ('1' or '0'), 7 history size, 8 history seconds,
-- 9 a fresh epoch, 10 meta seconds, 11 replication id, 12 max fragments, 13 max bytes,
-- 14 max open streams per topic, 15 timeout ms, 16 the idempotency window in ms (with KEYS[2]),
-- 17.. replication ids of the cluster's masters.
-- Returns {'ok', id, stream, seq, nodes, done}, {'repeat', record} or {refusal[, limit]}; a
-- sweep, how many it closed.
local prefix, size, hsecs, meta_ttl = ARGV[2], tonumber(ARGV[7]), ARGV[8], ARGV[10]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local function state_key(topic, id)
  return prefix .. 'a:' .. #topic .. ':' .. topic .. ':' .. id
end

-- Publishes the fragment `frag` of stream `id` of `topic` ('' opens one) whose state is now
-- `text`, `seq` fragments, `closed` ('-' open, 'd' done, 't' timed out); `s` its state before
-- (for where its folded entry is).
local function emit(topic, id, frag, text, seq, closed, s)
  local meta, stream, holes = prefix .. 'm:' .. topic, prefix .. 's:' .. topic, prefix .. 'f:' .. topic
  local epoch, offset = take_offset(meta, stream, ARGV[9], meta_ttl, ARGV[11], 17)
  if id == '' then id = epoch .. '-' .. offset end
  local head = ' ' .. id .. ' ' .. seq .. ' ' .. closed .. '\n'
  if size > 0 then
    redis.call('XADD', stream, 'MAXLEN', size, offset .. '-0', 'd', '\0f' .. head .. text)
    redis.call('EXPIRE', stream, hsecs)
    if s and s[3] and s[4] == epoch then
      -- Its previous folded entry goes: history holds one per stream. The hole is recorded,
      -- so a resume reading across it knows nothing was trimmed there.
      if redis.call('XDEL', stream, s[3] .. '-0') == 1 then
        redis.call('ZADD', holes, s[3], s[3])
      end
    end
    if redis.call('XLEN', stream) >= size then
      -- Holes before the oldest entry held say nothing any more.
      local first = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)[1]
      if first then
        local at = string.sub(first[1], 1, string.find(first[1], '-', 1, true) - 1)
        redis.call('ZREMRANGEBYSCORE', holes, '-inf', '(' .. at)
      end
    end
    if redis.call('EXISTS', holes) == 1 then redis.call('EXPIRE', holes, hsecs) end
  end
  local nodes = redis.call('SPUBLISH', prefix .. topic, epoch .. ' ' .. offset .. ' \0a' .. head .. frag)
  local state, open, member = state_key(topic, id), prefix .. 'o:' .. topic, id .. ' ' .. topic
  if closed == '-' then
    redis.call('HSET', state, 't', text, 'q', seq, 'h', offset, 'he', epoch)
    redis.call('ZADD', open, now, id)
    redis.call('ZADD', KEYS[1], now, member)
    redis.call('EXPIRE', open, meta_ttl)
    redis.call('EXPIRE', KEYS[1], meta_ttl)
  else
    -- Closed: only what answers a late append (409) stays.
    redis.call('HSET', state, 'c', closed, 'q', seq)
    redis.call('HDEL', state, 't', 'h', 'he')
    redis.call('ZREM', open, id)
    redis.call('ZREM', KEYS[1], member)
  end
  redis.call('EXPIRE', state, meta_ttl)
  if KEYS[2] then
    local done = closed == '-' and '0' or '1'
    redis.call('SET', KEYS[2], epoch .. ' ' .. offset .. ' ' .. id .. ' ' .. seq .. ' ' .. done, 'PX', ARGV[16])
  end
  return {'ok', epoch .. '-' .. offset, id, seq, nodes, closed == '-' and 0 or 1}
end

local op, topic, frag = ARGV[1], ARGV[3], ARGV[5]
if op == 'sweep' then
  -- Every node sweeps; the first to find a stream stale closes it, and it leaves the set.
  local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[15]), 'LIMIT', 0, 100)
  local closed = 0
  for _, member in ipairs(stale) do
    local sp = string.find(member, ' ', 1, true)
    local id, t = string.sub(member, 1, sp - 1), string.sub(member, sp + 1)
    local s = redis.call('HMGET', state_key(t, id), 't', 'q', 'h', 'he', 'c')
    if s[2] and not s[5] then
      emit(t, id, '', s[1] or '', tonumber(s[2]) + 1, 't', s)
      closed = closed + 1
    else
      -- Its state expired (or it closed meanwhile): nothing to announce.
      redis.call('ZREM', KEYS[1], member)
      redis.call('ZREM', prefix .. 'o:' .. t, id)
    end
  end
  return closed
end
if KEYS[2] then
  local prev = redis.call('GET', KEYS[2])
  if prev then return {'repeat', prev} end
end
local max_fragments, max_bytes = tonumber(ARGV[12]), tonumber(ARGV[13])
if op == 'open' then
  if redis.call('ZCARD', prefix .. 'o:' .. topic) >= tonumber(ARGV[14]) then
    return {'open', ARGV[14]}
  end
  if max_fragments < 1 then return {'fragments', ARGV[12]} end
  if #frag > max_bytes then return {'bytes', ARGV[13]} end
  return emit(topic, '', frag, frag, 1, '-', nil)
end
local s = redis.call('HMGET', state_key(topic, ARGV[4]), 't', 'q', 'h', 'he', 'c')
if not s[2] then return {'unknown'} end
if s[5] then return {'closed'} end
local seq = tonumber(s[2])
if seq >= max_fragments then return {'fragments', ARGV[12]} end
local text = s[1] or ''
if #text + #frag > max_bytes then return {'bytes', ARGV[13]} end
return emit(topic, ARGV[4], frag, text .. frag, seq + 1, ARGV[6] == '1' and 'd' or '-', s)
