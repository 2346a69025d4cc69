-- collect: drop the fields of entries that no view sees, fenced.
--
-- KEYS, 4 per entry:           its group's owner key (<ns>:o:<group>), the entry (<ns>:e:<codec key>),
--                              its group's index set (<ns>:i:<group>), its group's collection set (<ns>:c:<group>)
-- ARGV[1] token                the caller's owner token
-- ARGV, then per entry:        settled (fields it keeps once settled; -1: not settled), n (fields to drop),
--                              then those n fields (versions)
-- Returns the number of fields dropped; an error reply starting FENCED if a group has another owner.
-- An entry left with no field leaves its index and collection sets; one left with `settled` fields leaves
-- the collection set.
local token = ARGV[1]
for k = 1, #KEYS, 4 do
  if redis.call('GET', KEYS[k]) ~= token then
    return redis.error_reply('FENCED key group owned by another writer, not ' .. token)
  end
end
local a = 2
local dropped = 0
for k = 1, #KEYS, 4 do
  local entry = KEYS[k + 1]
  local settled = tonumber(ARGV[a])
  local n = tonumber(ARGV[a + 1])
  for i = a + 2, a + 1 + n do dropped = dropped + redis.call('HDEL', entry, ARGV[i]) end
  a = a + 2 + n
  local left = redis.call('HLEN', entry)
  if left == 0 then
    redis.call('SREM', KEYS[k + 2], entry)
    redis.call('SREM', KEYS[k + 3], entry)
  elseif left == settled then
    redis.call('SREM', KEYS[k + 3], entry)
  end
end
return dropped
