-- allot GCRA bucket: one atomic script for every operation.
-- The math mirrors bucket/gcra.go exactly; all values are integers below
-- 2^53, so Lua's doubles hold them exactly, and integer division is done by
-- idiv, which corrects the rounding of a/b for large quotients.
--
-- KEYS[1]  bucket: 40 bytes, five little-endian int64 (struct '<i8i8i8i8i8'):
--          TAT µs, rem, num, den, burst. The TAT is TAT + rem/den µs; num/den
--          (the interval in µs) and burst are the limit it was written under.
-- KEYS[2]  attempt record (optional, op 'd' only): four int64, the decision
-- ARGV     op ('d' decide, 't' take-up-to, 'r' return, 'p' peek, 'b' rebase);
--          int64s (struct '<i8...'): num, den, burst, n (cost / batch
--          size), attempt window ms, and for 'b' the limit the bucket moves
--          from: num, den, burst; now µs, or '' for the server's TIME
-- returns  {allowed, remaining, retry µs, reset µs, granted, repaired}
--
-- Binary values because parsing and formatting five decimal numbers cost
-- more server time than the rest of a decision.

local floor = math.floor

local function idiv(a, b)
  if b == 1 then return a end
  local q = floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- carry: a bucket that spent used of tolerance burst*num holds its tokens,
-- rounded down and at most the new burst, under the new limit (bucket.carry).
local function carry(used, onum, oburst, num, tau)
  local held = floor((oburst * onum - used) / onum * num)
  if held >= tau then return 0 end
  return tau - held
end

-- Arithmetic converts TIME's numeric strings (x + 0): cheaper than calling
-- tonumber, and this script's cost is mostly such overhead.
local key = KEYS[1]
local op = ARGV[1]
local num, den, burst, n, window = struct.unpack('<i8i8i8i8i8', ARGV[2])
local now
-- Keys expire on the server's clock. With an injected clock (tests and
-- deterministic drivers only) that clock is not the server's, so keys get
-- an hour of grace instead of expiring early in real time; the bucket's
-- meaning does not depend on the expiry, only its memory does.
local grace = 0
if ARGV[3] ~= '' then
  now = ARGV[3] + 0
  grace = 3600000
else
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end

if op == 'd' and KEYS[2] then
  local prev = redis.pcall('GET', KEYS[2])
  if type(prev) == 'string' and #prev == 32 then
    local a, rm, ra, rs = struct.unpack('<i8i8i8i8', prev)
    return {a, rm, ra, rs, 0, 0}
  end
end

-- The limit the stored state is read under: the from-limit for a rebase.
local lnum, lden, lburst = num, den, burst
if op == 'b' then
  lnum, lden, lburst = struct.unpack('<i8i8i8', ARGV[2], 41)
end
local ltau = lburst * lnum

-- used: how much of the tolerance ltau is spent at now (bucket.load). A
-- product (tat - now) * den beyond 2^53 is inexact but certainly above any
-- tau (< 2^52), so it caps exactly as gcra.go's overflow guard does.
local used = 0
local repaired = 0
local moved = false -- capped or carried to a new limit: store even if nothing is spent
-- A key of another type reads as an error table (length 0): like a corrupt
-- value it becomes an empty bucket, never a full one, and SET replaces it.
local v = redis.pcall('GET', key)
if v then
  local tat, rem, sn, sd, sb
  if #v == 40 and type(v) == 'string' then tat, rem, sn, sd, sb = struct.unpack('<i8i8i8i8i8', v) end
  if not tat or tat < 0 or rem < 0 or sn <= 0 or sd <= 0 or sb <= 0
     or rem >= sd or sb * sn > 4503599627370496 then
    used = ltau
    repaired = 1
  elseif tat < now or (tat == now and rem == 0) then
    used = 0
  elseif sn ~= lnum or sd ~= lden or sb ~= lburst then
    local stau = sb * sn
    used = carry(math.min((tat - now) * sd + rem, stau), sn, sb, lnum, ltau)
    moved = true
  else
    used = (tat - now) * lden + rem
    if used > ltau then
      used = ltau
      moved = true
    end
  end
end

local tau = burst * num
local allowed = 1
local granted = 0
local write = repaired == 1 or moved
local retry = 0
if op == 'd' then
  local inc = n * num
  if used + inc > tau then
    allowed = 0
    retry = idiv(used + inc - tau + den - 1, den)
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
elseif op == 'b' then
  used = carry(used, lnum, lburst, num, tau)
  write = true
else -- 'p' reads and never writes, whatever load found
  write = false
  if used + num > tau then
    allowed = 0
    retry = idiv(used + num - tau + den - 1, den)
  end
end

-- The TAT is now + q + r/den µs; reset, until the bucket is full, is that
-- rounded up to the µs.
local q, r = used, 0
if den ~= 1 then
  q = idiv(used, den)
  r = used - q * den
end
local reset = q
if r > 0 then reset = q + 1 end
if write then
  if used == 0 then
    redis.call('DEL', key)
  else
    -- reset ≥ 1 here; the rounded quotient never falls below the exact one,
    -- so the key never expires before the bucket is full.
    redis.call('SET', key, struct.pack('<i8i8i8i8i8', now + q, r, num, den, burst),
      'PX', floor((reset + 999) / 1000) + grace)
  end
end

local remaining = tau - used
if num ~= 1 then remaining = idiv(remaining, num) end
if op == 'd' and KEYS[2] then
  redis.call('SET', KEYS[2], struct.pack('<i8i8i8i8', allowed, remaining, retry, reset),
    'PX', window)
end
return {allowed, remaining, retry, reset, granted, repaired}
