-- read: every field and value of each entry, as one reply (a pipeline would cost a reply per entry).
--
-- KEYS[1 ..]                   entries (<ns>:e:<codec key>)
-- ARGV                         none
-- Returns one flat HGETALL list (field, value, field, value, ...) per entry, in KEYS order.
local out = {}
for i = 1, #KEYS do out[i] = redis.call('HGETALL', KEYS[i]) end
return out
