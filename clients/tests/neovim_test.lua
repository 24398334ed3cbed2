-- Headless Neovim test of clients/neovim: starts the real server through require('specdec').setup,
-- and for a Python and a Lua buffer asks for completion the way a user does (0.11: the
-- vim.lsp.completion menu; older: the omnifunc, <C-x><C-o>), accepts the first item with <C-y>,
-- and checks that the buffer gained exactly the item's text. The item's command (specdec.accept)
-- runs on acceptance; test_editors.py then checks the telemetry file recorded it as accepted.
--
-- Run (from the repo root):
--   SPECDEC_TEST_DIR=/tmp/x SPECDEC_TEST_CMD='["/repo/.venv/bin/specdec","serve"]' \
--     nvim --headless -u NONE -i NONE --cmd 'set rtp^=clients/neovim' -c 'luafile clients/tests/neovim_test.lua'
-- Writes $SPECDEC_TEST_DIR/result.json and exits 0, or exits 1 with the reason on stderr.
local dir = os.getenv('SPECDEC_TEST_DIR')
local cmd_json = os.getenv('SPECDEC_TEST_CMD')
if not dir or not cmd_json then
  io.stderr:write('SPECDEC_TEST_DIR and SPECDEC_TEST_CMD must be set\n')
  vim.cmd('cquit 1')
end
local cmd = vim.fn.json_decode(cmd_json)
-- The longest wait for the models to load (the first use converts the GGUF).
local timeout_ms = tonumber(os.getenv('SPECDEC_TEST_TIMEOUT_MS') or '300000')
-- Once they are loaded, one short completion takes seconds even on a busy CPU.
local completion_timeout_ms = 180000

-- Mid-line cursors, so the server completes the rest of one line.
local CASES = {
  { file = 'greet.py', lines = { 'import sys', '', '', 'def greet(name):', '    print("Hello, " + name' } },
  { file = 'greet.lua', lines = { 'local M = {}', '', 'function M.greet(name)', '  print("Hello, " .. name' } },
}

local function log(msg)
  io.stderr:write('[nvim ' .. tostring(vim.version().major) .. '.' .. tostring(vim.version().minor) .. '] '
    .. msg .. '\n')
end

local function fail(msg)
  log('FAIL: ' .. msg)
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
  vim.cmd('cquit 1')
end

vim.cmd('filetype on')
vim.o.completeopt = 'menu,menuone,noinsert'
vim.o.swapfile = false

require('specdec').setup({
  cmd = cmd,
  init_options = {
    -- fp32 weights: these cases check the client's plumbing on completions known to be non-empty, and
    -- int8 (the default on CPUs with VNNI) completes greet.lua with nothing
    quantization = 'none',
    maxTokensSingleLine = 8,
    maxTokensMultiLine = 16,
    debounceMs = 0,
    telemetry = true,
    telemetryPath = dir .. '/events.jsonl',
    telemetryText = true,
  },
})

local has_lsp_completion = vim.lsp.completion ~= nil and vim.lsp.config ~= nil

-- Polls `cond` every 100 ms without blocking the event loop (so typeahead and LSP messages are
-- processed), then calls `next`; fails after `ms`.
-- Runs fn; a Lua error fails the test instead of leaving Neovim waiting.
local function guarded(fn, ...)
  local ok, err = pcall(fn, ...)
  if not ok then
    fail('error: ' .. tostring(err))
  end
end

local function wait_for(what, ms, cond, next)
  local deadline = vim.loop.now() + ms
  local function poll()
    local ok, value = pcall(cond)
    if ok and value then
      return guarded(next, value)
    end
    if vim.loop.now() > deadline then
      return fail('timed out waiting for ' .. what .. (ok and '' or (': ' .. tostring(value))))
    end
    vim.defer_fn(poll, 100)
  end
  poll()
end

local function keys(s)
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(s, true, false, true), 'n', false)
end

local results = {}

local function run_case(i)
  local case = CASES[i]
  if not case then
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

  wait_for('the server to attach and load its models', timeout_ms, function()
    local client = require('specdec').client()
    return client and require('specdec').status.state == 'ready'
  end, function()
    local last = #case.lines
    vim.api.nvim_win_set_cursor(0, { last, #case.lines[last] })
    if has_lsp_completion then
      keys('A<Cmd>lua vim.lsp.completion.get()<CR>')
    else
      keys('A<C-x><C-o>')
    end
    wait_for('the completion menu', completion_timeout_ms, function()
      if vim.fn.pumvisible() == 1 then
        local items = vim.fn.complete_info({ 'items' }).items
        return items[1]
      end
    end, function(item)
      local lsp_item = item.user_data.nvim.lsp.completion_item
      local sent = (lsp_item.textEdit and lsp_item.textEdit.newText) or lsp_item.insertText or lsp_item.label
      log(case.file .. ': server sent ' .. vim.inspect(sent))
      local before = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
      keys('<C-y><Esc>')
      wait_for('the accepted text in the buffer', 10000, function()
        return vim.fn.mode() == 'n' and vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)[last] ~= before[last]
      end, function()
        local after = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
        local want = vim.deepcopy(case.lines)
        local sent_lines = vim.split(case.lines[last] .. sent, '\n', { plain = true })
        want[last] = sent_lines[1]
        for k = 2, #sent_lines do
          table.insert(want, last + k - 1, sent_lines[k])
        end
        if not vim.deep_equal(after, want) then
          return fail(case.file .. ': buffer is\n' .. table.concat(after, '\n') .. '\nexpected\n'
            .. table.concat(want, '\n'))
        end
        log(case.file .. ': accepted ' .. vim.inspect(sent))
        table.insert(results, { file = case.file, text = sent, command = lsp_item.command })
        -- Give the accept command (sent on CompleteDone) time to reach the server.
        vim.defer_fn(function() guarded(run_case, i + 1) end, 1000)
      end)
    end)
  end)
end

vim.defer_fn(function() guarded(run_case, 1) end, 0)
