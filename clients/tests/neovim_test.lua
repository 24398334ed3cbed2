-- Headless Neovim test of clients/neovim: starts the real server through require('specdec').setup and,
-- in a Python and a Lua buffer, completes the way a user does.
--
-- Ghost text ('native' on 0.12+, 'extmark' before): types the end of the last line key by key in insert
-- mode, with a completion plugin's traffic beside it (a shim that sends textDocument/completion on
-- every TextChangedI, as nvim-cmp and blink.cmp do), waits for the ghost text to appear by itself (its
-- extmark), then accepts it with the plugin's keys (greet.py: accept-word, pressed until it is all in;
-- greet.lua: <Tab>) and checks the buffer holds exactly the ghost text. With no ghost text shown, the
-- keys do what they did before: <Tab> indents, <C-]> runs the mapping it had.
-- Popup (0.7/0.8's fallback): <C-x><C-o> (0.11+: vim.lsp.completion.get()), <C-y>, and checks that the
-- buffer gained exactly the item's text.
-- Then, with an auto-pairs mapping (`(` types `()<Left>`), types `print(` in shout.py and accepts the
-- answer, which runs past the closed `)`: the buffer must be the item's text with its range applied
-- (written to autopairs.json, apart from result.json's two cases).
-- All on the server's defaults (confidence gate, quantization auto), with short completions.
-- With SPECDEC_TEST_PAUSES=1 (test_editors.py: 0.11 extmark, 0.12 native), first the pause table that
-- vscode_test.mjs times (neovim_pauses.lua: pauses.json's 14 pauses typed key by key, the last key to
-- the ghost text's extmark, with the statusline's wait beside it), on the server's own token limits as
-- in VS Code; written to pauses.json. The short limits are sent after it.
-- The accepted item's command (specdec.accept) is recorded as the client sends it; test_editors.py
-- then checks the telemetry file recorded the completion as accepted, with the text inserted.
--
-- Run (from the repo root):
--   SPECDEC_TEST_DIR=/tmp/x SPECDEC_TEST_CMD='["/repo/.venv/bin/specdec","serve"]' \
--   SPECDEC_TEST_DISPLAY=auto SPECDEC_TEST_EXPECT=extmark \
--     nvim --headless -u NONE -i NONE --cmd 'set rtp^=clients/neovim' -c 'luafile clients/tests/neovim_test.lua'
-- Writes $SPECDEC_TEST_DIR/result.json and exits 0, or exits 1 with the reason on stderr.
-- What the Neovim drivers share (neovim_driver.lua), from this file's folder; set up below.
local here = vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h')
local driver = dofile(here .. '/neovim_driver.lua')
local dir = os.getenv('SPECDEC_TEST_DIR')
local cmd_json = os.getenv('SPECDEC_TEST_CMD')
if not dir or not cmd_json then
  io.stderr:write('SPECDEC_TEST_DIR and SPECDEC_TEST_CMD must be set\n')
  vim.cmd('cquit 1')
end
local cmd = vim.fn.json_decode(cmd_json)
local display_option = os.getenv('SPECDEC_TEST_DISPLAY') or 'auto'
-- 'setup': require('specdec').setup(); 'enable' (0.11+, Neovim started with plugins loaded): only
-- vim.lsp.config + vim.lsp.enable('specdec'), lsp/specdec.lua and plugin/specdec.lua doing the rest
local start = os.getenv('SPECDEC_TEST_START') or 'setup'
local expect_display = os.getenv('SPECDEC_TEST_EXPECT')
local pauses_on = os.getenv('SPECDEC_TEST_PAUSES') == '1'
-- The longest wait for the models to load (the first use converts the GGUF).
local timeout_ms = tonumber(os.getenv('SPECDEC_TEST_TIMEOUT_MS') or '300000')
-- Once they are loaded, one short completion takes seconds even on a busy CPU.
local completion_timeout_ms = 180000
local TYPING_GAP_MS = 60 -- between keys typed, well under the wait for a pause (the server's, or Neovim's)

-- `lines` is the file; in ghost-text cases `typed` is then typed at the end of its last line. The
-- final text matches the popup cases', whose completions are known to be non-empty.
local CASES = {
  {
    file = 'greet.py',
    lines = { 'import sys', '', '', 'def greet(name):', '    print("Hello, "' },
    typed = ' + name',
    accept = 'accept_word',
  },
  {
    file = 'greet.lua',
    lines = {
      'local M = {}',
      '',
      'function M.welcome(name)',
      '  print("Welcome, " .. name .. "!")',
      'end',
      '',
      'function M.greet(name)',
      '  print("Hello, "',
    },
    typed = ' .. name',
    accept = 'accept',
  },
  -- typed with the auto-pairs mapping, which closes the bracket: `print()`, the cursor inside
  {
    file = 'shout.py',
    lines = {
      'def greet(name):',
      '    message = "Hello, " + name',
      '    print(message)',
      '',
      '',
      'def shout(name):',
      '    message = "HELLO, " + name.upper()',
      '    print',
    },
    typed = '(',
    closed = '()',
  },
}

-- log, fail, guarded and wait_for (polling every 50 ms, its default), from neovim_driver.lua. A failure leaves
-- :messages and the LSP log in $SPECDEC_TEST_DIR for test_editors.py's artifacts; an error in a wait's callback
-- fails the test instead of leaving Neovim waiting.
driver.setup({
  label = '[nvim ' .. tostring(vim.version().major) .. '.' .. tostring(vim.version().minor) .. ' ' .. display_option
    .. ' ' .. start .. ']',
  on_fail = function()
    local f = io.open(dir .. '/nvim-messages.txt', 'w')
    if f then
      f:write(vim.fn.execute('messages'))
      f:close()
    end
    -- Neovim logs the server's stderr to its LSP log.
    local lsp_log = vim.lsp.get_log_path()
    if vim.fn.filereadable(lsp_log) == 1 then
      vim.fn.writefile(vim.fn.readfile(lsp_log), dir .. '/lsp.log')
    end
  end,
  catch = true,
})
local log, fail, guarded, wait_for = driver.log, driver.fail, driver.guarded, driver.wait_for

-- Every Lua file of the plugin compiles on this Neovim's LuaJIT.
for _, pattern in ipairs({ 'lua/specdec/*.lua', 'lsp/specdec.lua', 'plugin/specdec.lua' }) do
  local files = vim.api.nvim_get_runtime_file(pattern, true)
  if #files == 0 then
    fail('no ' .. pattern .. ' on the runtimepath')
  end
  for _, file in ipairs(files) do
    local ok, err = loadfile(file)
    if not ok then
      fail('syntax: ' .. err)
    end
  end
end

vim.cmd('filetype on')
-- A mapping of its own on the dismiss key, which specdec's falls back to with no ghost text shown.
vim.cmd('inoremap <C-]> <Cmd>let g:specdec_test_fallback = get(g:, "specdec_test_fallback", 0) + 1<CR>')
-- An auto-pairs mapping like nvim-autopairs': `(` and `"` type the pair and leave the cursor inside.
vim.cmd('inoremap ( ()<Left>')
vim.cmd('inoremap " ""<Left>')
vim.o.completeopt = 'menu,menuone,noinsert'
vim.o.swapfile = false

-- The server's defaults (confidence gate, quantization auto), as a user gets them; short completions
-- (sent after the pauses when they run: those take the server's own limits, as VS Code's do).
local SHORT = { maxTokensSingleLine = 8, maxTokensMultiLine = 16 }
local init_options = {
  telemetry = true,
  telemetryPath = dir .. '/events.jsonl',
  telemetryText = true,
}
if not pauses_on then
  init_options = vim.tbl_extend('force', init_options, SHORT)
end
local specdec = require('specdec')
if start == 'enable' then
  if vim.g.loaded_specdec ~= true then
    fail('plugin/specdec.lua was not loaded')
  end
  vim.lsp.config('specdec', { cmd = cmd, init_options = init_options })
  vim.lsp.enable('specdec')
else
  specdec.setup({ cmd = cmd, display = display_option, init_options = init_options })
end
local display = specdec.display()
if expect_display and display ~= expect_display then
  fail('display is ' .. display .. ', expected ' .. expect_display)
end
log('display ' .. display)
local keys_opt = require('specdec.config').options.keymaps

-- The :help file: its tags build and resolve (in a copy: helptags writes a tags file beside it).
do
  local doc = vim.api.nvim_get_runtime_file('doc/specdec.txt', false)[1]
  if not doc then
    fail('doc/specdec.txt is not on the runtimepath')
  end
  vim.fn.mkdir(dir .. '/help/doc', 'p')
  vim.fn.writefile(vim.fn.readfile(doc), dir .. '/help/doc/specdec.txt')
  vim.cmd('helptags ' .. vim.fn.fnameescape(dir .. '/help/doc'))
  vim.opt.runtimepath:prepend(dir .. '/help')
  for _, tag in ipairs({ 'specdec', 'specdec-setup', 'specdec-keymaps', 'specdec-display', 'specdec-health' }) do
    vim.cmd('help ' .. tag)
    if vim.fn.expand('%:t') ~= 'specdec.txt' then
      fail(':help ' .. tag .. ' opened ' .. vim.fn.expand('%'))
    end
    vim.cmd('helpclose')
  end
end

-- The client's requests, as it sends them: commands run, and how many inline completions it asked for.
local sent = { commands = {}, inline = 0, answer = nil }
local spied = nil
local function spy(client)
  if spied == client.id then
    return
  end
  spied = client.id
  local methods = vim.fn.has('nvim-0.11') == 1 -- client:request(...) from 0.11, client.request(...) before
  local request = client.request
  -- returns the handler to pass on: for inline completions, one that also keeps the latest answer's
  -- first item with the line it was asked on (what accepting it must give)
  local function record(method, params, handler)
    if method == 'workspace/executeCommand' then
      table.insert(sent.commands, params)
    elseif method == 'textDocument/inlineCompletion' then
      sent.inline = sent.inline + 1
      local line = vim.api.nvim_get_current_line()
      if not handler then
        return handler
      end
      return function(err, result, ...)
        local item = type(result) == 'table' and (result.items or result)[1]
        if item then
          sent.answer = { item = item, line = line, position = params.position }
        end
        return handler(err, result, ...)
      end
    end
    return handler
  end
  if methods then
    client.request = function(self, method, params, handler, ...)
      return request(self, method, params, record(method, params, handler), ...)
    end
  else
    client.request = function(method, params, handler, ...)
      return request(method, params, record(method, params, handler), ...)
    end
  end
end

-- A completion plugin's traffic: textDocument/completion on every TextChangedI, as nvim-cmp and
-- blink.cmp send it; the answers are counted, not shown.
local cmp = { sent = 0, answered = 0 }
local function cmp_shim(bufnr)
  vim.api.nvim_create_autocmd('TextChangedI', {
    buffer = bufnr,
    callback = function()
      local client = specdec.client(bufnr)
      if not client then
        return
      end
      local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
      params.context = { triggerKind = 1 }
      cmp.sent = cmp.sent + 1
      require('specdec.server').request(client, 'textDocument/completion', params, function()
        cmp.answered = cmp.answered + 1
      end, bufnr)
    end,
  })
end

-- Keys as typed; `remap` lets mappings (the plugin's) apply.
local function keys(s, remap)
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(s, true, false, true), remap and 'mt' or 'nt', false)
end

local function chunk_hl(chunk)
  local hl = chunk[2]
  return type(hl) == 'table' and hl[#hl] or hl
end

local GHOST_HL = { SpecdecGhostText = true, ComplHint = true }

-- The text of an extmark's ghost parts (its hint, e.g. " (2/3)", left out).
local function text_of(chunks)
  local parts = {}
  for _, chunk in ipairs(chunks or {}) do
    if GHOST_HL[chunk_hl(chunk)] then
      table.insert(parts, chunk[1])
    end
  end
  return table.concat(parts)
end

-- The ghost text shown in the buffer, read back from its extmark (the plugin's or Neovim's), or nil.
local function ghost_text(bufnr)
  local namespaces = vim.api.nvim_get_namespaces()
  for _, name in ipairs({ 'specdec.ghost', 'nvim.lsp.inline_completion' }) do
    local ns = namespaces[name]
    for _, mark in ipairs(ns and vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true }) or {}) do
      local lines = { text_of(mark[4].virt_text) }
      for _, virt_line in ipairs(mark[4].virt_lines or {}) do
        table.insert(lines, text_of(virt_line))
      end
      local text = table.concat(lines, '\n')
      if text ~= '' then
        return text
      end
    end
  end
end

-- Whether the plugin has a request waiting or in flight (its own ghost text; Neovim's shows none).
local function busy(bufnr)
  return display == 'extmark' and require('specdec.trigger').busy(bufnr)
end

-- Whether the buffer holds `want`; if not, the test fails saying what it holds.
local function buffer_holds(case, bufnr, want)
  local after = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  if vim.deep_equal(after, want) then
    return true
  end
  fail(case.file .. ': buffer is\n' .. table.concat(after, '\n') .. '\nexpected\n' .. table.concat(want, '\n'))
  return false
end

local function lines_with(lines, row, text)
  -- `lines` with `text` inserted at the end of line `row`
  local want = vim.deepcopy(lines)
  local parts = vim.split(lines[row] .. text, '\n', { plain = true })
  want[row] = parts[1]
  for k = 2, #parts do
    table.insert(want, row + k - 1, parts[k])
  end
  return want
end

local results = {}
local run_case -- defined below: runs CASES[i], then the next

local function finish_case(i, result) -- the cases test_editors.py checks, in result.json
  table.insert(results, result)
  -- Give the accept command time to reach the server.
  vim.defer_fn(function()
    guarded(run_case, i + 1)
  end, 1000)
end

-- Types `text` one key at a time, then calls `next`.
local function type_slowly(text, next)
  local k = 0
  local function step()
    k = k + 1
    if k > #text then
      return guarded(next)
    end
    keys(text:sub(k, k))
    vim.defer_fn(function()
      guarded(step)
    end, TYPING_GAP_MS)
  end
  step()
end

local function ghost_case(i, case, bufnr)
  cmp_shim(bufnr)
  local start_line = case.lines[#case.lines]
  local last = #case.lines
  vim.api.nvim_win_set_cursor(0, { last, #start_line })
  local commands_before = #sent.commands
  local inline_before = sent.inline
  local completions_before = cmp.sent
  keys('A')
  type_slowly(case.typed, function()
    local typed_lines = vim.deepcopy(case.lines)
    typed_lines[last] = start_line .. case.typed
    if not vim.deep_equal(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false), typed_lines) then
      return fail(case.file .. ': typing gave ' .. vim.inspect(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)))
    end
    wait_for('ghost text', function()
      return not busy(bufnr) and ghost_text(bufnr)
    end, completion_timeout_ms, function(ghost)
      log(case.file .. ': ghost text ' .. vim.inspect(ghost) .. ' after ' .. (cmp.sent - completions_before)
        .. ' textDocument/completion requests beside it')
      local accept_key = keys_opt[case.accept]
      local presses = 0
      local last_ghost = ghost
      local function inserted()
        local now = table.concat(vim.api.nvim_buf_get_lines(bufnr, last - 1, -1, false), '\n')
        return now:sub(#typed_lines[last] + 1)
      end
      local function press()
        presses = presses + 1
        local before = inserted()
        last_ghost = ghost_text(bufnr)
        keys(accept_key, true)
        wait_for('the accepted text in the buffer', function()
          return inserted() ~= before
        end, 10000, function()
          if #inserted() < #ghost and presses < 40 then
            -- a part (a word): the rest stays shown, and the server's answer for it follows
            return wait_for('the rest of the ghost text', function()
              return not busy(bufnr) and ghost_text(bufnr)
            end, completion_timeout_ms, press)
          end
          keys('<Esc>')
          wait_for('normal mode', function()
            return vim.fn.mode() == 'n'
          end, 10000, function()
            local after = lines_with(typed_lines, last, ghost)
            if not buffer_holds(case, bufnr, after) then
              return
            end
            local command = sent.commands[#sent.commands]
            if #sent.commands == commands_before then
              return fail(case.file .. ': no command was sent on accept')
            end
            -- With no ghost text (dismissed), <C-]> runs the mapping it had and <Tab> indents.
            local fallbacks = vim.g.specdec_test_fallback or 0
            keys('A', false)
            keys(keys_opt.dismiss .. keys_opt.accept .. '<Esc>', true)
            wait_for('the keys without ghost text', function()
              local line = vim.api.nvim_buf_get_lines(bufnr, -2, -1, false)[1]
              return vim.fn.mode() == 'n' and (vim.g.specdec_test_fallback or 0) > fallbacks
                and line:find('^' .. vim.pesc(after[#after]) .. '[\t ]+$')
            end, 10000, function()
            log(case.file .. ': accepted ' .. vim.inspect(ghost) .. ' in ' .. presses .. ' key presses ('
              .. accept_key .. '); ' .. (sent.inline - inline_before) .. ' inline completion requests')
            finish_case(i, {
              file = case.file,
              text = ghost,
              accepted = last_ghost, -- the text of the item whose command ran
              command = command,
              completions = cmp.sent - completions_before,
              typed = #case.typed,
              inline_requests = sent.inline - inline_before,
              presses = presses,
            })
            end)
          end)
        end)
      end
      press()
    end)
  end)
end

-- `line` with `range` (an LSP range on it, in `encoding` units) replaced by `text`: the lines it makes.
local function replaced(line, text, range, encoding)
  local retype = require('specdec.retype')
  local from = retype.byte_col(line, range.start.character, encoding)
  local to = retype.byte_col(line, range['end'].character, encoding)
  return vim.split(line:sub(1, from) .. text .. line:sub(to + 1), '\n', { plain = true })
end

-- The answer must run past a bracket the auto-pairs mapping closed: typing `(` gives `()` with the
-- cursor inside, and the server's item replaces the `)` (its range covers it) or inserts before it.
-- Accepting it (<Tab>, or <C-y> in the menu) must leave exactly the item's text with its range applied.
-- Its result goes to autopairs.json, beside result.json.
local function autopairs_case(i, case, bufnr)
  local last = #case.lines
  local encoding = specdec.client(bufnr).offset_encoding
  vim.api.nvim_win_set_cursor(0, { last, #case.lines[last] })
  sent.answer = nil
  local commands_before = #sent.commands
  keys('A')
  keys(case.typed, true) -- remapped: the auto-pairs mapping closes the bracket
  local typed_line = case.lines[last] .. case.closed
  local function check(want, text, how)
    wait_for('the accepted text in the buffer', function()
      return vim.api.nvim_get_current_line() ~= typed_line
    end, 10000, function()
      keys('<Esc>')
      wait_for('normal mode', function()
        return vim.fn.mode() == 'n'
      end, 10000, function()
        local lines = vim.list_slice(case.lines, 1, last - 1)
        vim.list_extend(lines, want)
        if not buffer_holds(case, bufnr, lines) then
          return
        end
        if #sent.commands == commands_before and display ~= 'popup' then
          return fail(case.file .. ': no command was sent on accept')
        end
        log(case.file .. ': accepted ' .. vim.inspect(text) .. ' past the auto-closed bracket (' .. how .. ')')
        local f = assert(io.open(dir .. '/autopairs.json', 'w'))
        f:write(vim.fn.json_encode({ file = case.file, text = text, lines = lines, how = how }))
        f:close()
        vim.defer_fn(function()
          guarded(run_case, i + 1)
        end, 1000)
      end)
    end)
  end
  wait_for('the auto-closed bracket', function()
    return vim.api.nvim_get_current_line() == typed_line
  end, 10000, function()
    if display == 'popup' then
      keys(vim.lsp.completion and vim.lsp.completion.get and '<Cmd>lua vim.lsp.completion.get()<CR>' or '<C-x><C-o>')
      return wait_for('the completion menu', function()
        return vim.fn.pumvisible() == 1 and vim.fn.complete_info({ 'items' }).items[1]
      end, completion_timeout_ms, function(menu_item)
        local item = menu_item.user_data.nvim.lsp.completion_item
        local edit = item.textEdit
        log(case.file .. ': server sent ' .. vim.inspect(edit))
        keys('<C-y>')
        check(replaced(typed_line, edit.newText, edit.range, encoding), edit.newText, 'menu, range '
          .. edit.range.start.character .. '-' .. edit.range['end'].character)
      end)
    end
    wait_for('ghost text', function()
      local answer = sent.answer
      return not busy(bufnr) and ghost_text(bufnr) and answer and answer.line == typed_line and answer
    end, completion_timeout_ms, function(answer)
      local item = answer.item
      log(case.file .. ': ghost text ' .. vim.inspect(ghost_text(bufnr)) .. ' for ' .. vim.inspect(item))
      keys(keys_opt.accept, true)
      check(replaced(typed_line, item.insertText, item.range, encoding), item.insertText, 'ghost text, range '
        .. item.range.start.character .. '-' .. item.range['end'].character)
    end)
  end)
end

local function popup_case(i, case, bufnr)
  local last = #case.lines
  local lines = vim.deepcopy(case.lines)
  lines[last] = lines[last] .. case.typed
  vim.api.nvim_buf_set_lines(bufnr, 0, -1, false, lines)
  vim.api.nvim_win_set_cursor(0, { last, #lines[last] })
  if vim.lsp.completion and vim.lsp.completion.get then
    keys('A<Cmd>lua vim.lsp.completion.get()<CR>')
  else
    keys('A<C-x><C-o>')
  end
  wait_for('the completion menu', function()
    if vim.fn.pumvisible() == 1 then
      local items = vim.fn.complete_info({ 'items' }).items
      return items[1]
    end
  end, completion_timeout_ms, function(item)
    local lsp_item = item.user_data.nvim.lsp.completion_item
    local text = (lsp_item.textEdit and lsp_item.textEdit.newText) or lsp_item.insertText or lsp_item.label
    log(case.file .. ': server sent ' .. vim.inspect(text))
    local before = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
    keys('<C-y><Esc>')
    wait_for('the accepted text in the buffer', function()
      return vim.fn.mode() == 'n' and vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)[last] ~= before[last]
    end, 10000, function()
      if not buffer_holds(case, bufnr, lines_with(lines, last, text)) then
        return
      end
      log(case.file .. ': accepted ' .. vim.inspect(text))
      finish_case(i, { file = case.file, text = text, command = lsp_item.command })
    end)
  end)
end

-- Once specdec has attached to `bufnr` and loaded its models: next(client).
local function when_ready(bufnr, next)
  wait_for('the server to attach and load its models', function()
    local client = specdec.client(bufnr)
    return client and specdec.status.state == 'ready' and client
  end, timeout_ms, next)
end

-- Once the plugin has wired a ghost-text buffer (its buffer-local keys, set on LspAttach): next().
local function when_wired(bufnr, next)
  wait_for('the buffer-local keys', function()
    local map = vim.fn.maparg(keys_opt.accept, 'i', false, true)
    return map.buffer == 1 and map.desc and map.desc:find('^specdec: ')
  end, 10000, function()
    if display == 'native' then
      if not vim.lsp.inline_completion.is_enabled({ bufnr = bufnr }) then
        return fail('inline completion is not enabled in the buffer')
      elseif vim.lsp.inline_completion.is_enabled() then
        return fail('inline completion is enabled globally, not for the buffer')
      end
    end
    next()
  end)
end

run_case = function(i)
  local case = CASES[i]
  if not case then
    -- :checkhealth specdec, with the server running
    vim.cmd('checkhealth specdec')
    local report = vim.api.nvim_buf_get_lines(0, 0, -1, false)
    log('checkhealth specdec:\n  ' .. table.concat(report, '\n  '))
    local text = table.concat(report, '\n')
    if text:find('ERROR') or not text:find('speccomplete %d') or not text:find('display ' .. display) then
      return fail(':checkhealth specdec reports a problem')
    end
    local f = assert(io.open(dir .. '/result.json', 'w'))
    f:write(vim.fn.json_encode(results))
    f:close()
    log('all cases passed')
    return vim.cmd('qall!')
  end
  local path = dir .. '/' .. case.file
  vim.fn.writefile(case.lines, path)
  vim.cmd('edit ' .. vim.fn.fnameescape(path))
  local bufnr = vim.api.nvim_get_current_buf()
  log(case.file .. ': filetype ' .. vim.bo.filetype)

  when_ready(bufnr, function(client)
    spy(client)
    if case.closed and display == 'popup' then
      return autopairs_case(i, case, bufnr)
    elseif display == 'popup' then
      return popup_case(i, case, bufnr)
    end
    -- the plugin's keys are set once the buffer is wired (LspAttach)
    when_wired(bufnr, function()
      if case.closed then
        return autopairs_case(i, case, bufnr)
      end
      ghost_case(i, case, bufnr)
    end)
  end)
end

-- The pause table first (SPECDEC_TEST_PAUSES=1), on Neovim's filetype plugins and indentation (on by
-- default without -u NONE); then the cases above on the filetype settings they had and short completions.
local function run_pauses(next)
  local filetype = vim.fn.execute('filetype')
  vim.cmd('filetype plugin indent on')
  dofile(here .. '/neovim_pauses.lua').run({
    dir = dir,
    here = here,
    driver = driver,
    specdec = specdec,
    display = display,
    ghost_text = ghost_text,
    ghost_chunks = text_of,
    when_ready = when_ready,
    when_wired = when_wired,
  }, function()
    for _, kind in ipairs({ 'plugin', 'indent' }) do
      if filetype:find(kind .. ':OFF') then
        vim.cmd('filetype ' .. kind .. ' off')
      end
    end
    local client = specdec.client()
    local params = { settings = { specdec = SHORT } }
    if vim.fn.has('nvim-0.11') == 1 then -- client:notify from 0.11, client.notify before
      client:notify('workspace/didChangeConfiguration', params)
    else
      client.notify('workspace/didChangeConfiguration', params)
    end
    log('short completions from here: ' .. vim.inspect(SHORT))
    next()
  end)
end

vim.defer_fn(function()
  guarded(function()
    if pauses_on then
      return run_pauses(function()
        guarded(run_case, 1)
      end)
    end
    run_case(1)
  end)
end, 0)
