-- forget: drop fresh sets of versions every view sees (their entries need no collection), fenced.
--
-- KEYS[1 .. 2 * groups]        per group: its owner key (<ns>:o:<group>), its fresh versions (<ns>:v:<group>)
-- KEYS[2 * groups + 1 ..]      the fresh sets to forget (<ns>:f:<group>:<version>)
-- ARGV[1] token                the caller's owner token
-- ARGV[2] groups               how many (owner, fresh versions) pairs lead KEYS
-- ARGV[3 ..] position, version per fresh set: its group's position among the pairs (1-based) and its version
-- Returns the number of sets forgotten; an error reply starting FENCED if a group has another owner.
local token = ARGV[1]
local groups = tonumber(ARGV[2])
for g = 1, groups do
  if redis.call('GET', KEYS[2 * g - 1]) ~= token then
    return redis.error_reply('FENCED key group owned by another writer, not ' .. token)
  end
end
local a = 3
for k = 2 * groups + 1, #KEYS do
  redis.call('UNLINK', KEYS[k])
  redis.call('ZREM', KEYS[2 * tonumber(ARGV[a])], ARGV[a + 1])
  a = a + 2
end
return #KEYS - 2 * groups
