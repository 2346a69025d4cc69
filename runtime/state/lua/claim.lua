-- claim: reserve a block of versions and become the owner of key groups, in one step, so that no version
-- can be allocated between taking the token and owning the groups.
--
-- KEYS[1]                      the namespace's version clock (<ns>:clock)
-- KEYS[2 ..]                   owner keys of the groups to claim (<ns>:o:<group>)
-- ARGV[1] block                how many versions to reserve
-- Returns the last version of the block; its first version is the new owner token.
local finish = redis.call('INCRBY', KEYS[1], ARGV[1])
local token = finish - tonumber(ARGV[1]) + 1
for i = 2, #KEYS do redis.call('SET', KEYS[i], token) end
return finish
