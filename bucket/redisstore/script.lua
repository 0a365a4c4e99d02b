-- allot GCRA bucket: one atomic script for every operation, on one key or
-- on many. The math mirrors bucket/gcra.go exactly; all values are integers
-- below 2^53, so Lua's doubles hold them exactly, and integer division is
-- done by idiv, which corrects the rounding of a/b for large quotients.
--
-- A call carries a batch of operations, applied in order at one instant
-- (the script is atomic, so they all happen at that instant): concurrent
-- decisions share one round trip, one TIME and one script run.
--
-- KEYS     per operation: its bucket, then its attempt record when it has
--          one (decide only). A bucket is 40 bytes, five little-endian int64
--          (struct '<i8i8i8i8i8'): TAT µs, rem, num, den, burst. The TAT is
--          TAT + rem/den µs; num/den (the interval in µs) and burst are the
--          limit it was written under. An attempt record is four int64, the
--          decision.
-- ARGV[1]  the operations, 64 bytes each, eight int64: code, num, den,
--          burst, n (cost / batch size), and for a rebase the limit the
--          bucket moves from (num, den, burst; else 0). code is 1 decide,
--          2 take-up-to, 3 return, 4 peek, 5 rebase, plus 8 when the
--          operation has an attempt record.
-- ARGV[2]  now µs, or '' for the server's TIME
-- ARGV[3]  attempt window ms
-- returns  one string, 48 bytes per operation, six int64: allowed,
--          remaining, retry µs, reset µs, granted (for a rebase: the
--          tokens it took away), repaired
--
-- Binary values because parsing and formatting decimal numbers cost more
-- server time than the rest of a decision, and one string because building
-- six reply integers per operation cost more than packing them.

local floor = math.floor
local unpack = struct.unpack
local pack = struct.pack
local call = redis.call
local pcall = redis.pcall

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

-- Arithmetic converts numeric strings (x + 0): cheaper than calling
-- tonumber, and this script's cost is mostly such overhead.
local now
-- Keys expire on the server's clock. With an injected clock (tests and
-- deterministic drivers only) that clock is not the server's, so keys get
-- an hour of grace instead of expiring early in real time; the bucket's
-- meaning does not depend on the expiry, only its memory does.
local grace = 0
if ARGV[2] ~= '' then
  now = ARGV[2] + 0
  grace = 3600000
else
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
end
local window = ARGV[3] + 0

-- one applies operation op to the bucket at key and returns the six
-- result values. lnum, lden, lburst is the limit the stored state is read
-- under: the from-limit for a rebase, else the operation's own.
local function one(key, akey, op, num, den, burst, n, lnum, lden, lburst)
  if akey then
    local prev = pcall('GET', akey)
    if type(prev) == 'string' and #prev == 32 then
      local a, rm, ra, rs = unpack('<i8i8i8i8', prev)
      return a, rm, ra, rs, 0, 0
    end
  end
  local ltau = lburst * lnum

  -- used: how much of the tolerance ltau is spent at now (bucket.load). A
  -- product (tat - now) * den beyond 2^53 is inexact but certainly above
  -- any tau (< 2^52), so it caps exactly as gcra.go's overflow guard does.
  local used = 0
  local repaired = 0
  local moved = false -- capped or carried to a new limit: store even if nothing is spent
  -- A key of another type reads as an error table (length 0): like a
  -- corrupt value it becomes an empty bucket, never a full one, and SET
  -- replaces it.
  local v = pcall('GET', key)
  if v then
    local tat, rem, sn, sd, sb
    if #v == 40 and type(v) == 'string' then tat, rem, sn, sd, sb = unpack('<i8i8i8i8i8', v) end
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
  if op == 1 then
    local inc = n * num
    if used + inc > tau then
      allowed = 0
      retry = idiv(used + inc - tau + den - 1, den)
    else
      used = used + inc
      granted = n
      write = true
    end
  elseif op == 2 then
    granted = math.min(n, idiv(tau - used, num))
    if granted > 0 then
      used = used + granted * num
      write = true
    else
      granted = 0
      allowed = 0
    end
  elseif op == 3 then
    used = math.max(used - math.min(n, burst) * num, 0)
    write = true
  elseif op == 5 then
    if lburst == 0 then
      used = tau -- from a limit that admits nothing: empty (bucket.Rebase)
    else
      -- granted: the whole tokens the move takes away (bucket.clamped)
      local held = floor((lburst * lnum - used) / lnum * num)
      if held > tau then granted = floor((held - tau) / num) end
      used = carry(used, lnum, lburst, num, tau)
    end
    write = true
  else -- 4, peek: reads and never writes, whatever load found
    write = false
    if used + num > tau then
      allowed = 0
      retry = idiv(used + num - tau + den - 1, den)
    end
  end

  -- The TAT is now + q + r/den µs; reset, until the bucket is full, is
  -- that rounded up to the µs.
  local q, r = used, 0
  if den ~= 1 then
    q = idiv(used, den)
    r = used - q * den
  end
  local reset = q
  if r > 0 then reset = q + 1 end
  if write then
    if used == 0 then
      call('DEL', key)
    else
      -- reset ≥ 1 here; the rounded quotient never falls below the exact
      -- one, so the key never expires before the bucket is full.
      call('SET', key, pack('<i8i8i8i8i8', now + q, r, num, den, burst),
        'PX', floor((reset + 999) / 1000) + grace)
    end
  end

  local remaining = tau - used
  if num ~= 1 then remaining = idiv(remaining, num) end
  if akey then
    call('SET', akey, pack('<i8i8i8i8', allowed, remaining, retry, reset), 'PX', window)
  end
  return allowed, remaining, retry, reset, granted, repaired
end

local ops = ARGV[1]
local out = {}
local ki, pos = 1, 1
for i = 1, #ops / 64 do
  local code, num, den, burst, n, fnum, fden, fburst
  code, num, den, burst, n, fnum, fden, fburst, pos = unpack('<i8i8i8i8i8i8i8i8', ops, pos)
  local key = KEYS[ki]
  local akey = nil
  ki = ki + 1
  if code >= 8 then
    akey = KEYS[ki]
    ki = ki + 1
    code = code - 8
  end
  if code ~= 5 then fnum, fden, fburst = num, den, burst end
  out[i] = pack('<i8i8i8i8i8i8', one(key, akey, code, num, den, burst, n, fnum, fden, fburst))
end
return table.concat(out)
