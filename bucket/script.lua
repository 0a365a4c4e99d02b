-- allot GCRA bucket: one atomic script for every operation.
-- The math mirrors bucket/gcra.go exactly; all values are integers below
-- 2^53, so Lua's doubles hold them exactly, and integer division is done by
-- idiv, which corrects the rounding of a/b for large quotients.
--
-- KEYS[1]  bucket: the string "TAT rem num den" (TAT in µs; the TAT is
--          TAT + rem/den µs; num/den the interval it was written under)
-- KEYS[2]  attempt record (optional, op 'd' only)
-- ARGV     op ('d' decide, 't' take-up-to, 'r' return, 'p' peek),
--          num, den, burst, n (cost / batch size), now µs or '' for the
--          server's TIME, attempt window ms
-- returns  {allowed, remaining, retry µs, reset µs, granted, repaired}

local floor = math.floor

local function idiv(a, b)
  if b == 1 then return a end
  local q = floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local function cdiv(a, b)
  if a <= 0 then return 0 end
  return idiv(a + b - 1, b)
end

local key = KEYS[1]
local op = ARGV[1]
local num = tonumber(ARGV[2])
local den = tonumber(ARGV[3])
local burst = tonumber(ARGV[4])
local n = tonumber(ARGV[5])
local now
-- Keys expire on the server's clock. With an injected clock (tests and
-- deterministic drivers only) that clock is not the server's, so keys get
-- an hour of grace instead of expiring early in real time; the bucket's
-- meaning does not depend on the expiry, only its memory does.
local grace = 0
if ARGV[6] ~= '' then
  now = tonumber(ARGV[6])
  grace = 3600000
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

if op == 'd' and KEYS[2] then
  local prev = redis.pcall('GET', KEYS[2])
  if type(prev) == 'string' then
    local a, rm, ra, rs = string.match(prev, '^(%d+) (%d+) (%d+) (%d+)$')
    if a then
      return {tonumber(a), tonumber(rm), tonumber(ra), tonumber(rs), 0, 0}
    end
  end
end

local tau = burst * num
local used = 0
local repaired = 0
local moved = false -- capped or carried over to a new limit: store even if nothing is spent
local v = redis.pcall('GET', key)
if type(v) == 'table' and v.err then
  -- A key of another type: replace it with an empty bucket, never a full one.
  redis.call('DEL', key)
  used = tau
  repaired = 1
elseif v then
  local a, b, c, d = string.match(v, '^(%d+) (%d+) (%d+) (%d+)$')
  local tat, rem, sn, sd = tonumber(a), tonumber(b), tonumber(c), tonumber(d)
  if not (tat and rem and sn and sd) or sn <= 0 or sd <= 0 or rem < 0 or rem >= sd
     or tat ~= math.floor(tat) or rem ~= math.floor(rem) then
    used = tau
    repaired = 1
  elseif tat < now or (tat == now and rem == 0) then
    used = 0
  elseif sn ~= num or sd ~= den then
    local spent = ((tat - now) + rem / sd) * sd / sn
    local scaled = math.ceil(spent * num)
    if scaled >= tau then used = tau else used = scaled end
    moved = true
  elseif tat - now > idiv(tau, den) + 1 then
    used = tau
    moved = true
  else
    used = (tat - now) * den + rem
    if used > tau then
      used = tau
      moved = true
    end
  end
end

local allowed = 1
local granted = 0
local write = repaired == 1 or moved
local retry = 0
if op == 'd' then
  local inc = n * num
  if used + inc > tau then
    allowed = 0
    retry = cdiv(used + inc - tau, den)
  else
    used = used + inc
    granted = n
    write = true
  end
elseif op == 't' then
  granted = math.min(n, idiv(tau - used, num))
  if granted > 0 then
    used = used + granted * num
    write = true
  else
    granted = 0
    allowed = 0
  end
elseif op == 'r' then
  used = math.max(used - math.min(n, burst) * num, 0)
  write = true
else -- 'p'
  if used + num > tau then
    allowed = 0
    retry = cdiv(used + num - tau, den)
  end
end

local reset = cdiv(used, den)
if write then
  if used == 0 then
    redis.call('DEL', key)
  else
    local q = idiv(used, den)
    redis.call('SET', key, string.format('%d %d %d %d', now + q, used - q * den, num, den),
      'PX', math.max(cdiv(reset, 1000), 1) + grace)
  end
end

local remaining = idiv(tau - used, num)
if op == 'd' and KEYS[2] then
  redis.call('SET', KEYS[2], string.format('%d %d %d %d', allowed, remaining, retry, reset),
    'PX', tonumber(ARGV[7]))
end
return {allowed, remaining, retry, reset, granted, repaired}
