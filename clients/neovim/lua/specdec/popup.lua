-- The 'popup' display, the fallback where ghost text is not drawn (0.7/0.8 by default): the server's
-- textDocument/completion answer, one item holding the whole completion (its label is the first line),
-- in the completion menu. 0.11+: vim.lsp.completion (autotriggered); before: the omnifunc, <C-x><C-o>.
-- An item accepted from the menu is inserted whole, newlines included, and its command runs, so the
-- server records the acceptance.
local retype = require('specdec.retype')
local server = require('specdec.server')

local M = {}

local function specdec_item(completed)
  local data = type(completed) == 'table' and completed.user_data
  local item = type(data) == 'table' and data.nvim and data.nvim.lsp and data.nvim.lsp.completion_item
  if item and item.command and item.command.command == server.ACCEPT then
    return item
  end
end

local function item_text(item)
  return (item.textEdit and item.textEdit.newText) or item.insertText or item.label
end

-- The characters after the cursor that the item's edit replaces: its range runs from where it was asked
-- (now the start of the inserted word) over the closers after it (retype.lua), which are still right
-- after the cursor. Their byte count, or 0.
local function replaced_after(item, text, line, col, encoding)
  local range = item.textEdit and item.textEdit.range
  if not range or range.start.line ~= range['end'].line or range['end'].character <= range.start.character then
    return 0
  end
  local after = line:sub(col + 1)
  local bytes = retype.byte_col(after, range['end'].character - range.start.character, encoding)
  return retype.positions(text, after:sub(1, bytes)) and bytes or 0
end

-- The menu inserts an item's `word`: all of it before 0.11 (where each newline becomes a space), its
-- first line on 0.11+ (see `convert`). Replace that, and the closers its range covers, with the item's
-- exact text.
local function insert_full_text(completed, item, encoding)
  local text = item_text(item)
  local word = completed.word
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  local line = vim.api.nvim_get_current_line()
  local replaced = replaced_after(item, text, line, col, encoding)
  if text == word and not text:find('\n', 1, true) and replaced == 0 then
    return
  end
  local start = col - #word
  if start < 0 then
    return
  end
  local lines = vim.split(text, '\n', { plain = true })
  vim.api.nvim_buf_set_text(0, row - 1, start, row - 1, col + replaced, lines)
  local last_col = (#lines == 1 and start or 0) + #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { row + #lines - 1, last_col })
end

function M.attach(client, bufnr, options)
  local lsp_completion = vim.lsp.completion ~= nil and vim.lsp.completion.enable ~= nil
  if lsp_completion then
    -- vim.lsp.completion runs the item's command on accept; its `word` would be the text up to the
    -- first space, so show the first line, then insert it all.
    vim.lsp.completion.enable(true, client.id, bufnr, {
      autotrigger = options.autotrigger,
      convert = function(item)
        return { word = vim.split(item_text(item), '\n', { plain = true })[1] }
      end,
    })
  else
    vim.bo[bufnr].omnifunc = 'v:lua.vim.lsp.omnifunc'
  end
  vim.api.nvim_create_autocmd('CompleteDone', {
    group = vim.api.nvim_create_augroup('specdec.popup.' .. bufnr, { clear = true }),
    buffer = bufnr,
    callback = function()
      local completed = vim.v.completed_item
      local item = specdec_item(completed)
      if not item then
        return
      end
      insert_full_text(completed, item, client.offset_encoding)
      if not lsp_completion then -- the omnifunc runs no command
        server.run_command(client, item.command, bufnr)
      end
    end,
  })
end

return M
