-- Ghost text: a completion drawn with an extmark at the cursor, the way copilot.lua and llama.vim do.
-- The first line is inline virtual text (0.10+; before, an overlay that redraws the rest of the line
-- after it), the other lines are virtual lines below.
local M = {}

M.ns = vim.api.nvim_create_namespace('specdec.ghost')
M.HL = 'SpecdecGhostText'
M.HL_HINT = 'SpecdecGhostTextHint'

function M.define_highlights()
  vim.cmd('highlight default link ' .. M.HL .. ' Comment')
  vim.cmd('highlight default link ' .. M.HL_HINT .. ' NonText')
end

local has_inline = nil

-- Whether extmarks take virt_text_pos = 'inline' (Neovim 0.10+): tried once on a scratch buffer.
function M.has_inline()
  if has_inline == nil then
    local buf = vim.api.nvim_create_buf(false, true)
    has_inline = pcall(vim.api.nvim_buf_set_extmark, buf, M.ns, 0, 0, {
      virt_text = { { 'x', M.HL } },
      virt_text_pos = 'inline',
    })
    vim.api.nvim_buf_delete(buf, { force = true })
  end
  return has_inline
end

-- Virtual text shows a tab as one cell; show it as spaces.
local function untab(s, bufnr)
  return (s:gsub('\t', string.rep(' ', vim.bo[bufnr].tabstop)))
end

function M.clear(bufnr)
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  end
end

-- Show `text` at (row, col): 0-based row, byte column. `hint` (e.g. " (2/3)") follows it.
function M.show(bufnr, row, col, text, hint)
  M.clear(bufnr)
  local lines = vim.split(text, '\n', { plain = true })
  local virt_lines = {}
  for i = 2, #lines do
    table.insert(virt_lines, { { untab(lines[i], bufnr), M.HL } })
  end
  local virt_text = {}
  if lines[1] ~= '' then
    table.insert(virt_text, { untab(lines[1], bufnr), M.HL })
  end
  if hint then
    table.insert(#virt_lines > 0 and virt_lines[#virt_lines] or virt_text, { hint, M.HL_HINT })
  end
  local opts = { hl_mode = 'combine' }
  if #virt_lines > 0 then
    opts.virt_lines = virt_lines
  end
  if M.has_inline() then
    opts.virt_text_pos = 'inline'
  else
    -- No inline virtual text: draw over the rest of the line, then redraw that rest after the ghost.
    local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
    local rest = line:sub(col + 1)
    if rest ~= '' and #virt_text > 0 then
      table.insert(virt_text, { untab(rest, bufnr), 'Normal' })
    end
    opts.virt_text_pos = 'overlay'
  end
  if #virt_text > 0 then
    opts.virt_text = virt_text
  end
  if opts.virt_text or opts.virt_lines then
    vim.api.nvim_buf_set_extmark(bufnr, M.ns, row, col, opts)
  end
end

return M
