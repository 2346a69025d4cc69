-- write: versioned writes of one batch, fenced by the owner tokens of the key groups it touches.
--
-- KEYS[1 .. owners]            owner key of each key group touched (<ns>:o:<group>)
-- then per write, 5 keys:      entry (<ns>:e:<codec key>), the group's index set (<ns>:i:<group>),
--                              the group's collection set (<ns>:c:<group>),
--                              the fresh set of (group, version) (<ns>:f:<group>:<version>),
--                              the group's fresh versions (<ns>:v:<group>, a sorted set)
-- ARGV[1] token                the caller's owner token
-- ARGV[2] version              the field every write of the batch sets
-- ARGV[3] owners               how many owner keys lead KEYS
-- ARGV[4 ..] value             one per write, in KEYS order ("" is a tombstone)
-- Returns the number of writes applied; an error reply starting FENCED if a group has another owner.
--
-- A write that leaves the entry one field goes to the fresh set of its version: collection forgets the whole
-- set at once when every view sees that version (a bulk load costs nothing to collect). A write that adds a
-- field to an entry marks it in the collection set, to decide entry by entry. A tombstone for an entry that has
-- no field at all is not written: there is nothing for it to hide.
local token = ARGV[1]
local owners = tonumber(ARGV[3])
for i = 1, owners do
  local owner = redis.call('GET', KEYS[i])
  if owner ~= token then
    return redis.error_reply('FENCED key group owned by writer ' .. tostring(owner) .. ', not ' .. token)
  end
end
local version = ARGV[2]
local op = 4
local written = 0
for k = owners + 1, #KEYS, 5 do
  local entry = KEYS[k]
  if ARGV[op] ~= '' or redis.call('EXISTS', entry) == 1 then
    redis.call('HSET', entry, version, ARGV[op])
    redis.call('SADD', KEYS[k + 1], entry)
    if redis.call('HLEN', entry) > 1 then
      redis.call('SADD', KEYS[k + 2], entry)
    else
      redis.call('SADD', KEYS[k + 3], entry)
      redis.call('ZADD', KEYS[k + 4], version, version)
    end
    written = written + 1
  end
  op = op + 1
end
return written
