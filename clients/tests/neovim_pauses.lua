-- The pause table (issue 43) in Neovim: the 14 pauses of pauses.json that vscode_test.mjs types in VS Code
-- (and its two line-end ones, reported apart), typed here the same way, each in its own file; for each,
-- whether ghost text came by itself, the line as drawn and the milliseconds from the last key to the
-- ghost text's extmark. Written to $SPECDEC_TEST_DIR/pauses.json in vscode_test.mjs's shape, with the
-- statusline's wait (wait.lua's p50) beside the measured p50. neovim_test.lua runs it (SPECDEC_TEST_PAUSES=1).
--
-- How a user types it, on Neovim's defaults: insert mode, one key every keyDelayMs, Enter as the real
-- key (Neovim's own indentation: `filetype plugin indent on`, as Neovim starts without -u NONE). Only the
-- bracket a bracket pause leaves open goes through the test's auto-pairs mapping (`(` types `()<Left>`,
-- as nvim-autopairs does), so `closers` sits after the cursor at the pause as in VS Code; the brackets
-- and quotes the typed text closes itself are plain keys (VS Code overtypes its auto-closed ones: the
-- same line at the pause). No other auto-pairing: rs-new-method's `{` gets no `}` of its own, unlike VS Code.
local M = {}

local uv = vim.uv or vim.loop
local POLL_MS = 5 -- how often the ghost text is looked for after the last key
local OPENER = { [')'] = '(' } -- the closers the test's auto-pairs mapping makes

local function read_script(here)
  return vim.json.decode(table.concat(vim.fn.readfile(here .. '/pauses.json'), '\n'))
end

-- The position in `typed` of the bracket an auto-pairs plugin leaves open (closing `closers`): the
-- opener that no later key closes.
local function left_open(typed, closers)
  local open = OPENER[closers]
  local stack = {}
  for k = 1, #typed do
    local ch = typed:sub(k, k)
    if ch == open then
      table.insert(stack, k)
    elseif ch == closers then
      table.remove(stack)
    end
  end
  return open and #stack == 1 and stack[1] or nil
end

local function count(s, ch)
  return select(2, s:gsub(vim.pesc(ch), ''))
end

-- Each bracket pair and the double quotes balanced (vscode_test.mjs's `balanced`): a doubled closer shows.
local function balanced(line)
  for _, pair in ipairs({ { '(', ')' }, { '[', ']' }, { '{', '}' } }) do
    if count(line, pair[1]) ~= count(line, pair[2]) then
      return false
    end
  end
  return count(line, '"') % 2 == 0
end

local function median(xs)
  local s = vim.deepcopy(xs)
  table.sort(s)
  local mid = math.floor(#s / 2)
  if #s == 0 then
    return vim.NIL
  end
  return #s % 2 == 1 and s[mid + 1] or (s[mid] + s[mid + 1]) / 2
end

local function p90(xs) -- nearest rank
  local s = vim.deepcopy(xs)
  table.sort(s)
  return #s > 0 and s[math.ceil(0.9 * #s)] or vim.NIL
end

-- vscode_test.mjs's pauseTable, the same columns.
local function table_of(records)
  local function cell(v)
    if v == nil or v == vim.NIL then
      return ''
    end
    return (tostring(v):gsub('|', '\\|'):gsub('\n', '⏎'))
  end
  local out = {
    '| # | case | kind | typed | ghost text | ms | line drawn | past the bracket | why empty |',
    '|---|---|---|---|---|---|---|---|---|',
  }
  for i, r in ipairs(records) do
    local drawn = ''
    if r.shown then
      local line = r.line ~= vim.NIL and r.line or r.ghost
      if r.kind == 'line-end' then
        line = (r.line ~= vim.NIL and r.line or r.typed) .. '\n' .. (r.below ~= vim.NIL and r.below or r.ghost)
      end
      drawn = '`' .. cell(line) .. '`'
    end
    local past = r.pastBracket == nil and '' or (r.pastBracket and 'yes' or 'no')
    table.insert(out, '| ' .. table.concat({ i, r.id, r.kind, '`' .. cell(r.typed) .. '`', r.shown and 'yes' or 'no',
      cell(r.ms), drawn, past, cell(r.reason) }, ' | ') .. ' |')
  end
  return table.concat(out, '\n')
end

-- The ghost-text extmarks on 0-based `row` (the plugin's, or 0.12's own): the line with the ghost parts in
-- place (inline marks inserted, an overlay written over the text), and the lines drawn below it or nil.
-- `chunks_text(chunks)`: the text of an extmark's ghost parts.
local function drawn(bufnr, row, chunks_text)
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  local marks, below = {}, {}
  local namespaces = vim.api.nvim_get_namespaces()
  for _, name in ipairs({ 'specdec.ghost', 'nvim.lsp.inline_completion' }) do
    local ns = namespaces[name]
    local found = ns and vim.api.nvim_buf_get_extmarks(bufnr, ns, { row, 0 }, { row, -1 }, { details = true })
    for _, mark in ipairs(found or {}) do
      local d = mark[4]
      table.insert(marks, { col = mark[3], text = chunks_text(d.virt_text), overlay = d.virt_text_pos == 'overlay' })
      for _, virt_line in ipairs(d.virt_lines or {}) do
        table.insert(below, chunks_text(virt_line))
      end
    end
  end
  table.sort(marks, function(a, b)
    return a.col > b.col -- from the right, so the columns to the left stay right
  end)
  for _, m in ipairs(marks) do
    line = line:sub(1, m.col) .. m.text .. line:sub(m.col + 1 + (m.overlay and #m.text or 0))
  end
  return line, #below > 0 and table.concat(below, '\n') or vim.NIL
end

-- The rest of a pause's record once it has shown or timed out, in insert mode still: the line as Neovim
-- typed it, as drawn, the bracket checks of vscode_test.mjs, and from the server's latest
-- `specdec/completed` for the file since the pause began (`note`, or nil): its latency, or why nothing showed.
local function describe(record, p, bufnr, note, chunks_text)
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  record.typedLine = vim.api.nvim_get_current_line():sub(1, col) -- with Neovim's indentation after Enter
  if record.shown then
    record.line, record.below = drawn(bufnr, row - 1, chunks_text)
    local server_ms = note and note.outcome == 'shown' and tonumber(note.latencyMs)
    record.serverMs = server_ms and math.floor(server_ms + 0.5) or vim.NIL -- request in to answer out
  elseif not note then
    record.reason = 'no answer'
  elseif note.outcome == 'shown' then
    record.reason = 'answered, not drawn'
  else
    record.reason = (note.reason ~= nil and note.reason ~= vim.NIL) and note.reason or note.outcome
  end
  if p.closers and record.line ~= vim.NIL then
    local typed = record.typedLine
    local rest = record.line:sub(1, #typed) == typed and record.line:sub(#typed + 1) or ''
    local at = rest:find(p.closers, 1, true)
    record.pastBracket = at ~= nil and not rest:sub(at):match('^[%)%]}"\'%s]*$')
    record.balanced = balanced(record.line)
  end
end

-- opts: dir, here (this folder), driver, specdec, display, ghost_text(bufnr), ghost_chunks(chunks) (the
-- ghost parts' text), when_ready(bufnr, next(client)), when_wired(bufnr, next). Calls done() once
-- pauses.json is written; the pauses themselves never fail the test (a miss is a row saying why).
function M.run(opts, done)
  local log, fail, guarded, wait_for = opts.driver.log, opts.driver.fail, opts.driver.guarded, opts.driver.wait_for
  local specdec, ghost_text = opts.specdec, opts.ghost_text
  local script = read_script(opts.here)
  local folder = opts.dir .. '/pauses'
  vim.fn.mkdir(folder, 'p')

  -- Leaves insert mode, saves the file, then next(record).
  local function leave(record, next)
    vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes('<Esc>', true, false, true), 'nt', false)
    wait_for('normal mode', function()
      return vim.fn.mode() == 'n'
    end, 10000, function()
      vim.cmd('silent update')
      next(record)
    end)
  end

  -- Types p.typed key by key (`auto`: the key that goes through the auto-pairs mapping), then polls every
  -- POLL_MS for the ghost text, up to pauseTimeoutMs after the last key.
  local function type_and_wait(p, bufnr, auto, record, next)
    local uri = vim.uri_from_bufnr(bufnr)
    local started = uv.now()
    local k, last_key, tick = 0, nil, nil
    local function finish()
      local note = specdec.completed[uri]
      describe(record, p, bufnr, note and note.at >= started and note.params or nil, opts.ghost_chunks)
      log(p.id .. ': ' .. (record.shown and ('ghost text ' .. vim.inspect(record.ghost) .. ' ' .. record.ms
        .. ' ms after the last key; line ' .. vim.inspect(record.line))
        or ('no ghost text in ' .. script.pauseTimeoutMs .. ' ms (' .. record.reason .. ')')))
      leave(record, next)
    end
    -- Ghost text once the last key has gone in (the buffer changed since it was fed): one shown from
    -- before it and kept as typed along counts at once, as in vscode_test.mjs's clock.
    local function poll()
      local now = uv.hrtime()
      local ghost = vim.api.nvim_buf_get_changedtick(bufnr) > tick and ghost_text(bufnr)
      if ghost then
        record.shown, record.ghost = true, ghost
        record.ms = math.floor((now - last_key) / 1e6 + 0.5)
        return vim.defer_fn(function() -- the rest of a multi-part ghost text drawn, as vscode_test.mjs waits
          record.ghost = ghost_text(bufnr) or record.ghost
          guarded(finish)
        end, 300)
      end
      if (now - last_key) / 1e6 > script.pauseTimeoutMs then
        return finish()
      end
      vim.defer_fn(function()
        guarded(poll)
      end, POLL_MS)
    end
    local function step()
      k = k + 1
      local ch = p.typed:sub(k, k)
      local key = ch == '\n' and vim.api.nvim_replace_termcodes('<CR>', true, false, true) or ch
      tick = vim.api.nvim_buf_get_changedtick(bufnr)
      last_key = uv.hrtime()
      vim.api.nvim_feedkeys(key, k == auto and 'mt' or 'nt', false) -- remapped: the auto-pairs mapping
      vim.defer_fn(function()
        guarded(k < #p.typed and step or poll)
      end, k < #p.typed and script.keyDelayMs or POLL_MS)
    end
    vim.api.nvim_feedkeys('A', 'nt', false)
    vim.defer_fn(function()
      guarded(step)
    end, script.keyDelayMs)
  end

  -- One pause: its own file, the cursor at the end of its context, then the keys and the wait.
  local function run_pause(p, next)
    local language = p.file:match('%.py$') and 'python' or 'rust'
    local record = { id = p.id, language = language, kind = p.kind, typed = p.typed, shown = false, ms = vim.NIL,
      ghost = vim.NIL, line = vim.NIL }
    if p.after:sub(1, 1) ~= '\n' then
      return fail(p.id .. ': `after` must start a new line (the typing appends to the context\'s last line)')
    end
    local auto = p.closers and left_open(p.typed, p.closers)
    if p.closers and not auto then
      return fail(p.id .. ': no bracket for the auto-pairs mapping to close with ' .. p.closers)
    end
    local lines = vim.split(p.context .. p.after, '\n', { plain = true })
    if lines[#lines] == '' then
      table.remove(lines) -- after the last newline
    end
    local path = folder .. '/' .. p.file
    vim.fn.writefile(lines, path)
    vim.cmd('edit ' .. vim.fn.fnameescape(path))
    local bufnr = vim.api.nvim_get_current_buf()
    opts.when_ready(bufnr, function()
      opts.when_wired(bufnr, function()
        vim.api.nvim_win_set_cursor(0, { #vim.split(p.context, '\n', { plain = true }), 0 })
        type_and_wait(p, bufnr, auto, record, next)
      end)
    end)
  end

  local records, line_ends = {}, {}
  local queue = {}
  for _, p in ipairs(script.pauses) do
    table.insert(queue, { p, records })
  end
  for _, p in ipairs(script.lineEnd) do
    table.insert(queue, { p, line_ends })
  end
  local function shown_of(rs)
    local ms = {}
    for _, r in ipairs(rs) do
      if r.shown then
        table.insert(ms, r.ms)
      end
    end
    return ms
  end
  local i = 0
  local function next_pause()
    i = i + 1
    if queue[i] then
      return run_pause(queue[i][1], function(record)
        table.insert(queue[i][2], record)
        guarded(next_pause)
      end)
    end
    local measured = shown_of(records)
    -- The statusline's wait (wait.lua: the p50 of the waits the plugin measured, last change to answer).
    local status = specdec.statusline()
    local latency = {
      statusLine = status,
      statusMs = tonumber(status:match('(%d+)ms$')) or vim.NIL,
      waits = #require('specdec.wait').waits,
      measuredP50Ms = median(measured),
      measuredP90Ms = p90(measured),
    }
    latency.ratio = (latency.statusMs ~= vim.NIL and latency.measuredP50Ms ~= vim.NIL)
        and tonumber(string.format('%.2f', latency.statusMs / latency.measuredP50Ms)) or vim.NIL
    local all = vim.list_extend(vim.list_extend({}, records), line_ends)
    local report = {
      editor = string.format('neovim %d.%d.%d', vim.version().major, vim.version().minor, vim.version().patch),
      display = opts.display,
      shown = #measured,
      of = #records,
      latency = latency,
      table = table_of(all),
      pauses = records,
      lineEnd = { shown = #shown_of(line_ends), of = #line_ends, pauses = line_ends },
    }
    local f = assert(io.open(opts.dir .. '/pauses.json', 'w'))
    f:write(vim.json.encode(report))
    f:close()
    log('pauses: ghost text at ' .. report.shown .. ' of ' .. report.of .. '; line-end at ' .. report.lineEnd.shown
      .. ' of ' .. report.lineEnd.of .. '\n' .. report.table)
    log('statusline ' .. vim.inspect(status) .. ' (' .. latency.waits .. ' waits); keystroke to ghost text p50 '
      .. tostring(latency.measuredP50Ms) .. ' ms, p90 ' .. tostring(latency.measuredP90Ms) .. ' ms; ratio '
      .. tostring(latency.ratio))
    done()
  end
  next_pause()
end

return M
