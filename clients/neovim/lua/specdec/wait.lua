-- The user's wait for ghost text, measured here: from the buffer's last change or cursor move in insert
-- mode to the server's answer that shows something (its `specdec/completed`, which the server sends
-- just before the answer, and Neovim draws the answer at once). The statusline shows the p50 of the
-- last 100 waits: the server's own p50 (request in to answer out) leaves out the debounces and the pipe.
local M = {}

local KEPT = 100
local began = {} -- by document URI: when the wait began (uv.now(), ms)
M.waits = {} -- ms, oldest first

local function now()
  return (vim.uv or vim.loop).now()
end

-- Time the waits in a buffer with ghost text.
function M.attach(bufnr)
  local uri = vim.uri_from_bufnr(bufnr)
  vim.api.nvim_create_autocmd({ 'TextChangedI', 'TextChangedP', 'CursorMovedI' }, {
    group = vim.api.nvim_create_augroup('specdec.wait.' .. bufnr, { clear = true }),
    buffer = bufnr,
    callback = function()
      began[uri] = now()
    end,
  })
end

-- A `specdec/completed` for `uri`: a shown answer ends the wait that began at the last change there.
function M.answered(uri, outcome)
  local start = began[uri]
  if outcome ~= 'shown' or not start then
    return
  end
  began[uri] = nil -- one wait per pause: an answer asked for again without typing is no new wait
  table.insert(M.waits, now() - start)
  if #M.waits > KEPT then
    table.remove(M.waits, 1)
  end
end

-- The median wait (ms), or nil before the first.
function M.p50()
  if #M.waits == 0 then
    return nil
  end
  local sorted = vim.deepcopy(M.waits)
  table.sort(sorted)
  local middle = math.floor(#sorted / 2)
  if #sorted % 2 == 1 then
    return sorted[middle + 1]
  end
  return (sorted[middle] + sorted[middle + 1]) / 2
end

return M
