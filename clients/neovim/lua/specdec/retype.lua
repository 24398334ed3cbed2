-- Completions that retype what follows the cursor. An item's range may cover the closing brackets and
-- quotes after the cursor on its line (an auto-pairs mapping put them there): its text replaces them,
-- and holds them, in order, in its first line (a subsequence of it). So the ghost text is drawn around
-- the existing characters, and accepting a part of it overwrites those of them that the part retypes.
local M = {}

-- The byte column of `character` (an LSP position's, in `encoding` units) in `line`.
function M.byte_col(line, character, encoding)
  if encoding == 'utf-8' then
    return math.min(character, #line)
  end
  local units, i = 0, 1
  while i <= #line and units < character do
    local byte = line:byte(i)
    local len = byte >= 0xF0 and 4 or byte >= 0xE0 and 3 or byte >= 0xC0 and 2 or 1
    units = units + ((encoding == 'utf-16' and len == 4) and 2 or 1)
    i = i + len
  end
  return i - 1
end

-- Where the characters of `old` sit in the first line of `text`, matched from the right: a list of
-- { at = byte index in text, len = bytes }, or nil when `old` is not a subsequence of that line.
function M.positions(text, old)
  local first = text:match('^[^\n]*')
  local chars = vim.fn.split(old, '\\zs')
  local found, limit = {}, #first -- the match for chars[j] ends at or before limit
  for j = #chars, 1, -1 do
    local c, at, from = chars[j], nil, 1
    while true do
      local s = first:find(c, from, true)
      if not s or s + #c - 1 > limit then
        break
      end
      at, from = s, s + 1
    end
    if not at then
      return nil
    end
    found[j] = { at = at, len = #c }
    limit = at - 1
  end
  return found
end

-- The bytes of `old` that the first `n` bytes of `text` retype (those characters of `old` whose match
-- lies within them): accepting those bytes of `text` replaces that much of `old`.
function M.consumed(text, old, n)
  local bytes = 0
  for _, p in ipairs(M.positions(text, old) or {}) do
    if p.at + p.len - 1 > n then
      break
    end
    bytes = bytes + p.len
  end
  return bytes
end

-- The first line of `text` cut around the characters of `old`: a list of { text = the part to draw,
-- offset = the byte of `old` it goes before (#old: after all of it) }, or nil (not a subsequence).
function M.segments(text, old)
  local first = text:match('^[^\n]*')
  local positions = M.positions(text, old)
  if not positions then
    return nil
  end
  local segments, from, offset = {}, 1, 0
  for _, p in ipairs(positions) do
    table.insert(segments, { text = first:sub(from, p.at - 1), offset = offset })
    from, offset = p.at + p.len, offset + p.len
  end
  table.insert(segments, { text = first:sub(from), offset = offset })
  return segments
end

return M
