-- The 'native' display: Neovim 0.12's vim.lsp.inline_completion, enabled for the buffers specdec
-- attaches to (not globally, not for other buffers). Neovim asks as you type (200 ms after the cursor
-- stops), draws the ghost text and runs the item's command on accept.
local retype = require('specdec.retype')
local trigger = require('specdec.trigger')

local M = {}

local NS = 'nvim.lsp.inline_completion'

-- Whether this Neovim has it.
function M.available()
  local ic = vim.lsp.inline_completion
  return ic ~= nil and ic.enable ~= nil and ic.get ~= nil
end

function M.attach(_, bufnr)
  vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
end

-- Whether Neovim shows an inline completion in the buffer (its extmark is there).
function M.visible(bufnr)
  local ns = vim.api.nvim_get_namespaces()[NS]
  return ns ~= nil and #vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { limit = 1 }) > 0
end

-- Accept the shown completion: all of it (how: 'all'), or insert its next word or line (how: 'word' or
-- 'line'); a part that is the whole of it runs its command as a full accept does. Neovim asks again
-- when the cursor moves. The same call as trigger.accept, for the plugin's own ghost text.
function M.accept(bufnr, how)
  if how == 'all' then
    return vim.lsp.inline_completion.get({ bufnr = bufnr })
  end
  return vim.lsp.inline_completion.get({
    bufnr = bufnr,
    on_accept = function(item)
      local text = item.insert_text
      if type(text) ~= 'string' then
        return item -- a snippet: whole
      end
      local row, col = unpack(vim.api.nvim_win_get_cursor(0))
      row = row - 1
      local old = '' -- the closers after the cursor that the item retypes (its range's text; retype.lua)
      if item.range then
        -- what was typed since the request is on screen already; drop it from the text
        local start_row, start_col, end_row, end_col = item.range:to_extmark()
        if start_row == row and start_col <= col then
          local typed = vim.api.nvim_buf_get_text(bufnr, row, start_col, row, col, {})[1]
          if text:sub(1, #typed) == typed then
            text = text:sub(#typed + 1)
          end
          if end_row == row and end_col > start_col then -- typing at its start moved its end along
            old = vim.api.nvim_buf_get_text(bufnr, row, col, row, end_col + (col - start_col), {})[1]
          end
        end
      end
      local piece = how == 'word' and trigger.word_of(text) or trigger.line_of(text)
      local replaced = old ~= '' and retype.consumed(text, old, #piece) or 0
      local lines = vim.split(piece, '\n', { plain = true })
      vim.api.nvim_buf_set_text(bufnr, row, col, row, col + replaced, lines)
      vim.api.nvim_win_set_cursor(0, { row + #lines, (#lines == 1 and col or 0) + #lines[#lines] })
      if piece == text and item.command then
        local client = vim.lsp.get_client_by_id(item.client_id)
        if client then
          client:exec_cmd(item.command, { bufnr = bufnr })
        end
      end
      return nil -- inserted here
    end,
  })
end

function M.cycle(bufnr, step)
  if not M.visible(bufnr) then
    return false
  end
  vim.lsp.inline_completion.select({ bufnr = bufnr, count = step })
  return true
end

-- Neovim has no public dismiss: disabling and enabling it for the buffer drops what it shows; it asks
-- again when the cursor moves.
function M.dismiss(bufnr)
  if not M.visible(bufnr) then
    return false
  end
  vim.lsp.inline_completion.enable(false, { bufnr = bufnr })
  vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
  return true
end

return M
