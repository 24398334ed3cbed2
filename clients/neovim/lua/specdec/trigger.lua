-- The 'extmark' display: asks for textDocument/inlineCompletion as you type (the previous request
-- cancelled), shows the answer as ghost text (ghost.lua), and accepts it whole, by word or by
-- line. Typing what the ghost text shows keeps the rest of it on screen; moving the cursor, leaving
-- insert mode or the buffer clears it. An item whose range covers the closers after the cursor is
-- drawn around them and replaces them (retype.lua). On an asked-for (invoked) request, an empty answer
-- says why in the message area.
local config = require('specdec.config')
local ghost = require('specdec.ghost')
local retype = require('specdec.retype')
local server = require('specdec.server')

local uv = vim.uv or vim.loop

local M = {}

local INVOKED, AUTOMATIC = 1, 2 -- lsp.InlineCompletionTriggerKind

-- By buffer: { client_id, timer, waiting (for the timer), seq (the latest request's number), pending
-- (its LSP id), last (the tick and cursor handled last), invoked (when the latest request was asked
-- for, to say why it came back empty), shown = { row, col, text, items, index, typed (what was typed
-- or accepted of the item so far), tails (by item: the bytes of the line after the text it replaces;
-- nil: it replaces nothing) } }
local buffers = {}

local function cursor()
  local pos = vim.api.nvim_win_get_cursor(0)
  return pos[1] - 1, pos[2]
end

local function position_key(bufnr)
  local row, col = cursor()
  return vim.api.nvim_buf_get_changedtick(bufnr) .. ':' .. row .. ':' .. col
end

local function item_text(item)
  local text = item.insertText
  if type(text) == 'table' then -- a snippet (lsp.StringValue): its text as written
    text = text.value
  end
  return type(text) == 'string' and text or ''
end

-- The text after the cursor that the shown item retypes and replaces: from (row, col) to its tail.
local function old_text(bufnr, shown, row, col)
  local tail = shown.tails and shown.tails[shown.index]
  if not tail then
    return ''
  end
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  if #line - tail < col then
    return nil -- the replaced text is gone
  end
  return line:sub(col + 1, #line - tail)
end

local function stop_timer(s)
  s.timer:stop()
  s.waiting = false
end

local function cancel_pending(bufnr)
  local s = buffers[bufnr]
  s.seq = s.seq + 1 -- whatever answers now is stale
  if s.pending then
    local client = vim.lsp.get_client_by_id(s.client_id)
    if client then
      server.cancel(client, s.pending)
    end
    s.pending = nil
  end
end

-- Clear the ghost text and forget it.
local function hide(bufnr)
  buffers[bufnr].shown = nil
  ghost.clear(bufnr)
end

local function show(bufnr, shown)
  local s = buffers[bufnr]
  local old = old_text(bufnr, shown, shown.row, shown.col)
  if not old or (old ~= '' and not retype.positions(shown.text, old)) then
    return hide(bufnr) -- what it replaces no longer fits it
  end
  s.shown = shown
  local hint = #shown.items > 1 and string.format(' (%d/%d)', shown.index, #shown.items) or nil
  ghost.show(bufnr, shown.row, shown.col, shown.text, hint, old)
end

-- Show what is left of `shown` once `taken`, its start, is in the buffer (typed along or accepted),
-- with the cursor at row, col.
local function show_rest(bufnr, shown, row, col, taken)
  show(bufnr, {
    row = row,
    col = col,
    text = shown.text:sub(#taken + 1),
    items = shown.items,
    index = shown.index,
    typed = (shown.typed or '') .. taken,
    tails = shown.tails,
  })
end

-- Ask the server for a completion at the cursor.
function M.request(bufnr, kind)
  local s = buffers[bufnr]
  local client = s and vim.lsp.get_client_by_id(s.client_id)
  if not client or vim.api.nvim_get_current_buf() ~= bufnr then
    return
  end
  stop_timer(s)
  cancel_pending(bufnr)
  local seq = s.seq
  s.invoked = kind == INVOKED and seq or nil
  local asked = uv.now()
  local row, col = cursor()
  local key = position_key(bufnr)
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = kind or AUTOMATIC }
  local ok, id = server.request(client, 'textDocument/inlineCompletion', params, function(err, result)
    if s.seq ~= seq then
      return -- superseded or cancelled
    end
    s.pending = nil
    if err or type(result) ~= 'table' then
      if s.invoked == seq then
        require('specdec').explain_empty(bufnr, err and 'error' or nil, asked)
      end
      return
    end
    if not vim.startswith(vim.api.nvim_get_mode().mode, 'i') or vim.api.nvim_get_current_buf() ~= bufnr
      or position_key(bufnr) ~= key then
      return -- the user moved on; a newer request follows if they typed
    end
    local items, tails, undrawable = {}, {}, false
    local at = params.position
    local line = vim.api.nvim_get_current_line()
    for _, item in ipairs(result.items or result) do
      -- specdec's items start at the cursor and replace nothing, or the closers after it on its line
      -- (which their first line retypes); others are not drawn here
      local range = item.range
      local text = item_text(item)
      local tail = nil
      local fits = text ~= ''
      if range and fits then
        local stop = range['end']
        fits = range.start.line == at.line and range.start.character == at.character and stop.line == at.line
          and stop.character >= at.character
        if fits and stop.character > at.character then
          local stop_col = retype.byte_col(line, stop.character, client.offset_encoding)
          fits = retype.positions(text, line:sub(col + 1, stop_col)) ~= nil
          tail = #line - stop_col
        end
      end
      if fits then
        table.insert(items, item)
        tails[#items] = tail
      elseif text ~= '' then
        undrawable = true
      end
    end
    if #items == 0 then
      hide(bufnr)
      if s.invoked == seq then
        require('specdec').explain_empty(bufnr, undrawable and 'undrawable' or nil, asked)
      end
    else
      show(bufnr, { row = row, col = col, text = item_text(items[1]), items = items, index = 1, tails = tails })
    end
  end, bufnr)
  if ok then
    s.pending = id
  end
end

-- Ask after debounce_ms, unless the user types on; without it, at once (the server waits for the pause).
function M.schedule(bufnr)
  local s = buffers[bufnr]
  if not s or not config.options.auto_trigger then
    return
  end
  stop_timer(s)
  cancel_pending(bufnr)
  s.waiting = true
  s.timer:start(config.options.debounce_ms or 0, 0, vim.schedule_wrap(function()
    s.waiting = false
    if buffers[bufnr] == s and vim.startswith(vim.api.nvim_get_mode().mode, 'i')
      and vim.api.nvim_get_current_buf() == bufnr then
      M.request(bufnr, AUTOMATIC)
    end
  end))
end

-- The text typed since the ghost text was drawn, if it is what the ghost text showed: keep the rest
-- on screen. Returns whether it did.
local function follow_typing(bufnr)
  local shown = buffers[bufnr].shown
  if not shown then
    return false
  end
  local row, col = cursor()
  if row < shown.row or (row == shown.row and col < shown.col) then
    return false
  end
  if shown.tails and shown.tails[shown.index] and row ~= shown.row then
    return false -- what it replaces is on the line it was asked on
  end
  local ok, between = pcall(vim.api.nvim_buf_get_text, bufnr, shown.row, shown.col, row, col, {})
  local typed = ok and table.concat(between, '\n') or ''
  if typed == '' or #typed >= #shown.text or shown.text:sub(1, #typed) ~= typed then
    return false
  end
  show_rest(bufnr, shown, row, col, typed)
  return true
end

-- TextChangedI / CursorMovedI / TextChangedP: both fire for one keystroke; handle it once.
local function on_change(bufnr)
  local s = buffers[bufnr]
  if vim.api.nvim_get_current_buf() ~= bufnr then
    return
  end
  local key = position_key(bufnr)
  if key == s.last then
    return
  end
  local typed = s.last and key:match('^%d+') ~= s.last:match('^%d+') -- the text changed, not only the cursor
  s.last = key
  if not (typed and follow_typing(bufnr)) then
    hide(bufnr)
  end
  M.schedule(bufnr)
end

-- Stop asking, clear the ghost text.
function M.dismiss(bufnr)
  local s = buffers[bufnr]
  if not s then
    return false
  end
  local had = s.shown ~= nil
  stop_timer(s)
  cancel_pending(bufnr)
  hide(bufnr)
  return had
end

-- The part of `text` that accept_word / accept_line take.
local function word_of(text)
  return text:match('^%s*[%w_]+') or text:match('^%s*[^%w_%s]+') or text
end

local function line_of(text)
  local newline = text:find('\n', 1, true)
  if newline == nil then
    return text
  elseif newline > 1 then
    return text:sub(1, newline - 1) -- the rest of this line
  end
  local next_newline = text:find('\n', 2, true) -- on a line break: it and the next line
  return next_newline and text:sub(1, next_newline - 1) or text
end

M.word_of, M.line_of = word_of, line_of

-- Insert the shown completion ('all'), or its next word or line. Returns false when none is shown.
function M.accept(bufnr, how)
  local s = buffers[bufnr]
  local shown = s and s.shown
  if not shown then
    return false
  end
  local row, col = cursor()
  if row ~= shown.row or col ~= shown.col then
    M.dismiss(bufnr)
    return false
  end
  local piece = shown.text
  if how == 'word' then
    piece = word_of(piece)
  elseif how == 'line' then
    piece = line_of(piece)
  end
  stop_timer(s)
  cancel_pending(bufnr)
  ghost.clear(bufnr)
  -- the characters after the cursor that this piece retypes are replaced by it
  local old = old_text(bufnr, shown, row, col) or ''
  local replaced = old ~= '' and retype.consumed(shown.text, old, #piece) or 0
  local lines = vim.split(piece, '\n', { plain = true })
  vim.api.nvim_buf_set_text(bufnr, row, col, row, col + replaced, lines)
  local end_row = row + #lines - 1
  local end_col = (#lines == 1 and col or 0) + #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { end_row + 1, end_col })
  s.last = position_key(bufnr)
  if piece == shown.text then
    s.shown = nil
    -- The whole completion is in: the server records it as accepted.
    local client = vim.lsp.get_client_by_id(s.client_id)
    if client then
      server.run_command(client, shown.items[shown.index].command, bufnr)
    end
  else
    show_rest(bufnr, shown, end_row, end_col, piece)
  end
  M.schedule(bufnr) -- the next completion, or (after a part) the server's take on the rest
  return true
end

-- Show the next (1) or previous (-1) of the items; with none shown, ask for a completion.
function M.cycle(bufnr, step)
  local s = buffers[bufnr]
  if not s then
    return false
  end
  local shown = s.shown
  if not shown then
    M.request(bufnr, INVOKED)
    return true
  end
  -- the items that agree with what was typed (or accepted) of the shown one since it came
  local typed = shown.typed or ''
  local fits, at = {}, 1
  for i, item in ipairs(shown.items) do
    local text = item_text(item)
    if #text > #typed and text:sub(1, #typed) == typed then
      table.insert(fits, i)
      if i == shown.index then
        at = #fits
      end
    end
  end
  local index = fits[(at - 1 + step) % #fits + 1]
  show(bufnr, {
    row = shown.row,
    col = shown.col,
    text = item_text(shown.items[index]):sub(#typed + 1),
    items = shown.items,
    index = index,
    typed = shown.typed,
    tails = shown.tails,
  })
  return true
end

-- Whether ghost text is shown in the buffer.
function M.visible(bufnr)
  return buffers[bufnr] ~= nil and buffers[bufnr].shown ~= nil
end

-- Whether a request is waiting for its delay or its answer (for tests and statuslines).
function M.busy(bufnr)
  local s = buffers[bufnr]
  return s ~= nil and (s.pending ~= nil or s.waiting)
end

function M.detach(bufnr)
  local s = buffers[bufnr]
  if not s then
    return
  end
  M.dismiss(bufnr)
  s.timer:close()
  buffers[bufnr] = nil
  pcall(vim.api.nvim_del_augroup_by_name, 'specdec.trigger.' .. bufnr)
end

function M.attach(client, bufnr)
  if buffers[bufnr] then
    buffers[bufnr].client_id = client.id
    return
  end
  buffers[bufnr] = { client_id = client.id, timer = uv.new_timer(), waiting = false, seq = 0 }
  local group = vim.api.nvim_create_augroup('specdec.trigger.' .. bufnr, { clear = true })
  local function on(events, fn)
    vim.api.nvim_create_autocmd(events, {
      group = group,
      buffer = bufnr,
      callback = function()
        fn(bufnr)
      end,
    })
  end
  on('InsertEnter', function()
    buffers[bufnr].last = position_key(bufnr)
    M.schedule(bufnr)
  end)
  on({ 'TextChangedI', 'TextChangedP', 'CursorMovedI' }, on_change)
  on({ 'InsertLeave', 'BufLeave' }, M.dismiss)
  on({ 'BufUnload', 'BufWipeout' }, M.detach)
end

return M
