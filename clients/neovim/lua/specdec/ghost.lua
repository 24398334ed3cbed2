-- Ghost text: a completion drawn with an extmark at the cursor, the way copilot.lua and llama.vim do.
-- The first line is inline virtual text (0.10+; before, an overlay that redraws the rest of the line
-- after it), the other lines are virtual lines below. A completion that retypes the closers after the
-- cursor (retype.lua) is drawn around them: one inline mark before each, and one after the last.
local retype = require('specdec.retype')

local M = {}

M.ns = vim.api.nvim_create_namespace('specdec.ghost')
M.HL = 'SpecdecGhostText'
M.HL_HINT = 'SpecdecGhostTextHint'

-- `group`'s foreground for `mode` ('gui' or 'cterm'), links followed; nil if it has none.
local function fg_of(group, mode)
  local fg = vim.fn.synIDattr(vim.fn.synIDtrans(vim.fn.hlID(group)), 'fg#', mode)
  return fg ~= '' and fg ~= '-1' and fg or nil
end

-- The colours of `like` (Comment, NonText), with a grey where it has none: a terminal without
-- 'termguicolors' uses ctermfg, which Neovim 0.10+'s default colorscheme leaves unset for these.
-- `default`, so a colorscheme or the user's own :highlight wins; set again on ColorScheme.
local function define(name, like)
  vim.cmd(string.format('highlight default %s ctermfg=%s guifg=%s', name, fg_of(like, 'cterm') or '8',
    fg_of(like, 'gui') or '#808080'))
end

function M.define_highlights()
  define(M.HL, 'Comment')
  define(M.HL_HINT, 'NonText')
  -- Neovim 0.12's own display (native.lua) draws in ComplHint, linked to NonText, which has no ctermfg
  -- either: grey it where nothing gives it a terminal colour, keeping its GUI colour.
  if vim.fn.hlexists('ComplHint') == 1 and not fg_of('ComplHint', 'cterm') then
    vim.api.nvim_set_hl(0, 'ComplHint', { ctermfg = 8, fg = fg_of('ComplHint', 'gui') or '#808080' })
  end
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

-- Show `text` at (row, col): 0-based row, byte column. `hint` (e.g. " (2/3)") follows it. `old`: the
-- text after the cursor that `text` retypes and replaces ('' for none), drawn between its parts.
function M.show(bufnr, row, col, text, hint, old)
  M.clear(bufnr)
  local segments = old and old ~= '' and retype.segments(text, old)
  if segments and M.has_inline() then
    return M.show_around(bufnr, row, col, text, hint, segments)
  end
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
    if segments and #virt_text > 0 then
      -- the first line holds the retyped characters: draw them as the buffer's, between the ghost parts
      local hinted = #virt_lines == 0 and hint
      virt_text = {}
      for k, segment in ipairs(segments) do
        if k > 1 then
          table.insert(virt_text, { untab(old:sub(segments[k - 1].offset + 1, segment.offset), bufnr), 'Normal' })
        end
        if segment.text ~= '' then
          table.insert(virt_text, { untab(segment.text, bufnr), M.HL })
        end
      end
      if hinted then
        table.insert(virt_text, { hint, M.HL_HINT })
      end
      rest = rest:sub(#old + 1)
    end
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

-- Inline virtual text around the retyped characters: each part of the first line at the byte of the
-- buffer it goes before; the other lines, and the hint, with the last part.
function M.show_around(bufnr, row, col, text, hint, segments)
  local lines = vim.split(text, '\n', { plain = true })
  for k, segment in ipairs(segments) do
    local last = k == #segments
    local virt_text = {}
    if segment.text ~= '' then
      table.insert(virt_text, { untab(segment.text, bufnr), M.HL })
    end
    local opts = { hl_mode = 'combine', virt_text_pos = 'inline' }
    if last then
      local virt_lines = {}
      for i = 2, #lines do
        table.insert(virt_lines, { { untab(lines[i], bufnr), M.HL } })
      end
      if hint then
        table.insert(#virt_lines > 0 and virt_lines[#virt_lines] or virt_text, { hint, M.HL_HINT })
      end
      if #virt_lines > 0 then
        opts.virt_lines = virt_lines
      end
    end
    if #virt_text > 0 then
      opts.virt_text = virt_text
    end
    if opts.virt_text or opts.virt_lines then
      vim.api.nvim_buf_set_extmark(bufnr, M.ns, row, col + segment.offset, opts)
    end
  end
end

return M
