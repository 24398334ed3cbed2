-- Buffer-local insert-mode keys, set when specdec attaches to a buffer. Each runs its action; when
-- the action does nothing (no ghost text shown), the key does what it did before: the mapping it had
-- (buffer-local, else global), or the key itself.
local M = {}

M.DESCRIPTIONS = {
  accept = 'accept the completion',
  accept_word = 'accept the next word of the completion',
  accept_line = 'accept the next line of the completion',
  next = 'next completion',
  prev = 'previous completion',
  dismiss = 'dismiss the completion',
}

local function termcodes(keys)
  return vim.api.nvim_replace_termcodes(keys, true, false, true)
end

-- Run the mapping `lhs` had in `bufnr` before ours (maparg's dict), or type the key itself.
local function fallback(lhs, previous)
  -- (0.7 hands a Lua callback over as a number, which cannot be called from Lua: type the key)
  local callback = previous and type(previous.callback) == 'function' and previous.callback
  if not previous or (previous.rhs == nil and not callback) then -- maparg's {} for no mapping
    return vim.api.nvim_feedkeys(termcodes(lhs), 'ni', false)
  end
  local flags = (previous.noremap == 1 and 'n' or 'm') .. 'i'
  local keys
  if callback then
    keys = callback()
    if previous.expr ~= 1 then
      return
    end
    if previous.replace_keycodes ~= 0 and type(keys) == 'string' then -- keymap.set's default for expr
      keys = termcodes(keys)
    end
  elseif previous.expr == 1 then
    keys = vim.api.nvim_eval(previous.rhs)
  else
    keys = termcodes(previous.rhs)
  end
  if type(keys) == 'string' and keys ~= '' then
    vim.api.nvim_feedkeys(keys, flags, false)
  end
end

-- What each key did in each buffer before specdec mapped it: by buffer, by lhs.
local previous_maps = {}

-- Map `keys` ({ action name = lhs or false }) in `bufnr` to `actions` ({ name = fn(bufnr) -> done }).
function M.set(bufnr, keys, actions)
  previous_maps[bufnr] = previous_maps[bufnr] or {}
  local saved = previous_maps[bufnr]
  for name, lhs in pairs(keys or {}) do
    local action = actions[name]
    if lhs and action then
      local previous = vim.api.nvim_buf_call(bufnr, function()
        return vim.fn.maparg(lhs, 'i', false, true)
      end)
      -- ours, from an earlier attach: keep what it fell back to
      if not (previous.desc and previous.desc:find('^specdec: ')) then
        saved[lhs] = previous
      end
      vim.keymap.set('i', lhs, function()
        if not action(bufnr) then
          fallback(lhs, saved[lhs])
        end
      end, { buffer = bufnr, desc = 'specdec: ' .. (M.DESCRIPTIONS[name] or name), silent = true })
    end
  end
end

return M
