-- Presence of one topic across the cluster (docs/presence.md), one script for every change so
-- each runs atomically and its events take their place in the topic's channel order.
-- KEYS: 1 members (sub -> connections on all nodes), 2 infos (sub -> info JSON),
--       3 connections per node (node -> connections, members' and anonymous),
--       4 the room's version, 5 one node's members (sub -> its connections on that node),
--       6 the nodes with a subscriber that asked for events (node -> 1).
-- ARGV: 1 operation, 2 the topic's channel, 3 the node, 4 the topic, then per operation:
--   apply:      5 the change in the node's connections in the room ('' none), 6 '1' when the
--               node has a subscriber that asked for events, then triples sub, connections to
--               add (negative: remove), info JSON ('' none); returns the node's connections in
--               the room after the change, or -1 when 5 was ''
--   sync:       5 the node's connections, 6 as for apply, then triples sub, connections, info
--   reap:       (KEYS[5] is the dead node's members; ARGV[3] the dead node)
--   list:       5 after ('' from the start), 6 limit, 7 '1': a subscriber of this node now
--               asks for events (recorded before the list is read)
--   count:      nothing more
-- An event is published as '!VERSION JSON', and only while some node has a subscriber that
-- asked for events (nobody else would read it); versions come from the server clock and only
-- grow, so a member list read at version V contains every event up to V. A node's listener
-- mark stays until the node is reaped, and the marks expire a day after the last was set: a
-- few events too many rather than one too few.
local op = ARGV[1]

local function version()
  local t = redis.call('TIME')
  local v = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local prev = tonumber(redis.call('GET', KEYS[4]) or '0')
  if v <= prev then v = prev + 1 end
  local s = string.format('%.0f', v)
  redis.call('SET', KEYS[4], s, 'EX', 604800)
  return s
end

local function event(kind, sub, info)
  if redis.call('EXISTS', KEYS[6]) == 0 then return end
  local json = '{"type":"' .. kind .. '","topic":' .. cjson.encode(ARGV[4]) ..
    ',"member":{"sub":' .. cjson.encode(sub)
  if info and info ~= '' then json = json .. ',"info":' .. info end
  redis.call('SPUBLISH', ARGV[2], '!' .. version() .. ' ' .. json .. '}}')
end

-- Moves `n` connections of `sub` on this node (KEYS[5]) in or out; a member appears with its
-- first connection anywhere and disappears with its last.
local function move(sub, n, info)
  if n == 0 then return end
  local mine = redis.call('HINCRBY', KEYS[5], sub, n)
  if mine <= 0 then
    redis.call('HDEL', KEYS[5], sub)
    n = n - mine
  end
  local total = redis.call('HINCRBY', KEYS[1], sub, n)
  if n > 0 and total == n then
    if info ~= '' then redis.call('HSET', KEYS[2], sub, info) end
    event('join', sub, info)
  elseif total <= 0 then
    local held = redis.call('HGET', KEYS[2], sub)
    redis.call('HDEL', KEYS[1], sub)
    redis.call('HDEL', KEYS[2], sub)
    event('leave', sub, held)
  end
end

local function listening(flag)
  if flag == '1' then
    redis.call('HSET', KEYS[6], ARGV[3], 1)
    redis.call('EXPIRE', KEYS[6], 86400)
  end
end

-- This node's connections in the room.
local function conns(n)
  if tonumber(n) > 0 then
    redis.call('HSET', KEYS[3], ARGV[3], n)
  else
    redis.call('HDEL', KEYS[3], ARGV[3])
  end
end

-- This node's connections in the room, moved by `d`; what they are now.
local function conns_by(d)
  local n = redis.call('HINCRBY', KEYS[3], ARGV[3], d)
  if n <= 0 then
    redis.call('HDEL', KEYS[3], ARGV[3])
    return 0
  end
  return n
end

local function total_connections()
  local sum = 0
  for _, n in ipairs(redis.call('HVALS', KEYS[3])) do sum = sum + tonumber(n) end
  return sum
end

if op == 'apply' then
  listening(ARGV[6])
  for i = 7, #ARGV, 3 do move(ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]) end
  if ARGV[5] == '' then return -1 end
  return conns_by(tonumber(ARGV[5]))
elseif op == 'sync' then
  listening(ARGV[6])
  local want = {}
  for i = 7, #ARGV, 3 do want[ARGV[i]] = tonumber(ARGV[i + 1]) end
  local have = redis.call('HGETALL', KEYS[5])
  for i = 1, #have, 2 do
    local sub = have[i]
    if not want[sub] then move(sub, -tonumber(have[i + 1]), '') end
  end
  for i = 7, #ARGV, 3 do
    local now = tonumber(redis.call('HGET', KEYS[5], ARGV[i]) or '0')
    move(ARGV[i], want[ARGV[i]] - now, ARGV[i + 2])
  end
  conns(ARGV[5])
elseif op == 'reap' then
  local have = redis.call('HGETALL', KEYS[5])
  for i = 1, #have, 2 do move(have[i], -tonumber(have[i + 1]), '') end
  redis.call('DEL', KEYS[5])
  conns('0')
  redis.call('HDEL', KEYS[6], ARGV[3])
elseif op == 'list' then
  listening(ARGV[7])
  local subs = redis.call('HKEYS', KEYS[1])
  table.sort(subs)
  local limit = tonumber(ARGV[6])
  local out = {redis.call('GET', KEYS[4]) or '0', #subs, total_connections(), 0}
  local taken = 0
  for _, s in ipairs(subs) do
    if ARGV[5] == '' or s > ARGV[5] then
      if taken == limit then
        out[4] = 1
        break
      end
      taken = taken + 1
      out[#out + 1] = s
      out[#out + 1] = redis.call('HGET', KEYS[2], s) or ''
      out[#out + 1] = tonumber(redis.call('HGET', KEYS[1], s) or '0')
    end
  end
  return out
elseif op == 'count' then
  return {redis.call('HLEN', KEYS[1]), total_connections()}
end
return 1
