-- settle: unmark collection-set entries left with one field that every view sees, fenced.
--
-- KEYS, 3 per marked entry:    its group's owner key (<ns>:o:<group>), its group's collection set
--                              (<ns>:c:<group>), the entry (<ns>:e:<codec key>); all of groups whose views
--                              have the same common versions
-- ARGV[1] token                the caller's owner token
-- ARGV[2 ..] low, high         the versions common to every view, as inclusive intervals
-- Returns the positions (1-based, per entry) of the entries not settled, for the client to decide; an error
-- reply starting FENCED if a group has another owner.
local token = ARGV[1]
for k = 1, #KEYS, 3 do
  if redis.call('GET', KEYS[k]) ~= token then
    return redis.error_reply('FENCED key group owned by another writer, not ' .. token)
  end
end
local undecided = {}
for k = 1, #KEYS, 3 do
  local fields = redis.call('HKEYS', KEYS[k + 2])
  local settled = false
  if #fields == 1 then
    local v = tonumber(fields[1])
    for i = 2, #ARGV, 2 do
      if tonumber(ARGV[i]) <= v and v <= tonumber(ARGV[i + 1]) then settled = true end
    end
  end
  if settled then
    redis.call('SREM', KEYS[k + 1], KEYS[k + 2])
  else
    undecided[#undecided + 1] = (k + 2) / 3
  end
end
return undecided
