-- Headless Neovim test of clients/neovim's ghost-text behaviour against fake_lsp.py, a stand-in server
-- that answers at once (or after $FAKE_LSP_DELAY_MS) with known completions, in seconds where the real
-- server takes minutes: multi-line ghost text, cycling, accept by word and by line, the command run
-- only for a whole completion, dismiss; for 'extmark' also typing along, clearing on cursor moves and
-- on leaving insert mode, and stale answers dropped and cancelled.
--
-- Run (from the repo root):
--   SPECDEC_TEST_DIR=/tmp/x SPECDEC_TEST_DISPLAY=extmark \
--     nvim --headless -u NONE -i NONE --cmd 'set rtp^=clients/neovim' -c 'luafile clients/tests/neovim_logic_test.lua'
-- fake_lsp.py logs what it receives to $SPECDEC_TEST_DIR/fake-lsp.jsonl. Exits 0, or 1 with the
-- reason on stderr.
local dir = assert(os.getenv('SPECDEC_TEST_DIR'), 'SPECDEC_TEST_DIR must be set')
local display_option = os.getenv('SPECDEC_TEST_DISPLAY') or 'auto'
local DELAY_MS = 250 -- the fake server's answer time: longer than the checks that must beat it
local log_path = dir .. '/fake-lsp.jsonl'

local function log(msg)
  io.stderr:write(string.format('[nvim %d.%d %s logic] %s\n', vim.version().major, vim.version().minor,
    display_option, msg))
end

local function fail(msg)
  log('FAIL: ' .. msg)
  vim.cmd('cquit 1')
end

vim.cmd('filetype on')
vim.o.swapfile = false
vim.env.FAKE_LSP_DELAY_MS = tostring(DELAY_MS)
vim.env.FAKE_LSP_LOG = log_path

local specdec = require('specdec')
specdec.setup({
  cmd = { 'python3', vim.fn.fnamemodify('clients/tests/fake_lsp.py', ':p') },
  display = display_option,
  debounce_ms = 50,
})
local display = specdec.display()
local extmark = display == 'extmark'
local keymaps = require('specdec.config').options.keymaps

-- Messages the fake server received, by method.
local function received(method)
  local found = {}
  for _, line in ipairs(vim.fn.filereadable(log_path) == 1 and vim.fn.readfile(log_path) or {}) do
    local message = vim.fn.json_decode(line)
    if message.method == method then
      table.insert(found, message)
    end
  end
  return found
end

-- The ghost text shown, from its extmark (the plugin's or Neovim's), and the extmark's details.
local function ghost()
  local namespaces = vim.api.nvim_get_namespaces()
  for _, name in ipairs({ 'specdec.ghost', 'nvim.lsp.inline_completion' }) do
    local ns = namespaces[name]
    for _, mark in ipairs(ns and vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true }) or {}) do
      local function text_of(chunks)
        local parts = {}
        for _, chunk in ipairs(chunks or {}) do
          local hl = type(chunk[2]) == 'table' and chunk[2][#chunk[2]] or chunk[2]
          if hl == 'SpecdecGhostText' or hl == 'ComplHint' then
            table.insert(parts, chunk[1])
          end
        end
        return table.concat(parts)
      end
      local lines = { text_of(mark[4].virt_text) }
      for _, virt_line in ipairs(mark[4].virt_lines or {}) do
        table.insert(lines, text_of(virt_line))
      end
      return table.concat(lines, '\n'), mark[4]
    end
  end
end

local function keys(s)
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(s, true, false, true), 'mt', false)
end

-- Each step gets `next`; `wait(what, ms, cond, then)` polls without blocking the event loop.
local steps = {}
local function step(name, fn)
  table.insert(steps, { name = name, fn = fn })
end

local function run(i)
  local s = steps[i]
  if not s then
    log('all steps passed')
    return vim.cmd('qall!')
  end
  local ok, err = pcall(s.fn, function()
    vim.schedule(function()
      run(i + 1)
    end)
  end)
  if not ok then
    fail(s.name .. ': ' .. tostring(err))
  end
end

local function wait(what, ms, cond, next)
  local deadline = vim.loop.now() + ms
  local function poll()
    local ok, value = pcall(cond)
    if ok and value then
      return next(value)
    end
    if vim.loop.now() > deadline then
      return fail('timed out waiting for ' .. what .. (ok and '' or (': ' .. tostring(value)))
        .. '; ghost text ' .. vim.inspect(ghost()) .. ', line ' .. vim.inspect(vim.api.nvim_get_current_line()))
    end
    vim.defer_fn(poll, 20)
  end
  poll()
end

local function expect_ghost(text, ms, next)
  wait('ghost text ' .. vim.inspect(text), ms or 2000, function()
    return ghost() == text
  end, next)
end

-- No ghost text now, nor for `ms` after.
local function expect_none(ms, next)
  local deadline = vim.loop.now() + ms
  local function poll()
    if ghost() then
      return fail('unexpected ghost text ' .. vim.inspect(ghost()))
    end
    if vim.loop.now() > deadline then
      return next()
    end
    vim.defer_fn(poll, 20)
  end
  poll()
end

local function expect_lines(want)
  local lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  if not vim.deep_equal(lines, want) then
    error('buffer is ' .. vim.inspect(lines) .. ', expected ' .. vim.inspect(want))
  end
end

step('attach', function(next)
  vim.fn.writefile({ 'def f(a):', '    ' }, dir .. '/f.py')
  vim.cmd('edit ' .. vim.fn.fnameescape(dir .. '/f.py'))
  wait('the buffer-local keys', 10000, function()
    local map = vim.fn.maparg(keymaps.accept, 'i', false, true)
    return map.buffer == 1 and map.desc and map.desc:find('^specdec: ')
  end, next)
end)

step('ghost text appears as you type, first line inline, the rest below', function(next)
  vim.api.nvim_win_set_cursor(0, { 2, 4 })
  keys('Ar')
  expect_ghost('eturn foo(a)\n    # done', 3000, function()
    local _, details = ghost()
    local want = (extmark and not require('specdec.ghost').has_inline()) and 'overlay' or 'inline'
    if details.virt_text_pos ~= want or #details.virt_lines ~= 1 then
      error('extmark ' .. vim.inspect(details))
    end
    next()
  end)
end)

step('next and previous cycle through the items', function(next)
  keys(keymaps.next)
  expect_ghost('eturn 2', 1000, function()
    keys(keymaps.prev)
    expect_ghost('eturn foo(a)\n    # done', 1000, next)
  end)
end)

if extmark then
  step('typing what it shows keeps the rest shown at once', function(next)
    keys('e')
    -- before the fake server could answer (debounce + its delay)
    expect_ghost('turn foo(a)\n    # done', DELAY_MS, next)
  end)
else
  step('typing on', function(next)
    keys('e')
    expect_ghost('turn foo(a)\n    # done', 3000, next)
  end)
end

step('accept word, then line by line: the command runs once, for the whole', function(next)
  wait('no request in flight', 2000, function()
    return not (extmark and require('specdec.trigger').busy(0))
  end, function()
    keys(keymaps.accept_word)
    wait('the word', 1000, function()
      return vim.api.nvim_get_current_line() == '    return'
    end, function()
      expect_ghost(' foo(a)\n    # done', 3000, function()
        keys(keymaps.accept_line)
        wait('the rest of the line', 1000, function()
          return vim.api.nvim_get_current_line() == '    return foo(a)'
        end, function()
          expect_ghost('\n    # done', 3000, function()
            if #received('workspace/executeCommand') ~= 0 then
              error('a command ran for a part of the completion')
            end
            keys(keymaps.accept_line)
            wait('the next line', 1000, function()
              return vim.api.nvim_buf_line_count(0) == 3
            end, function()
              expect_lines({ 'def f(a):', '    return foo(a)', '    # done' })
              wait('the accept command', 2000, function()
                return #received('workspace/executeCommand') == 1
              end, next)
            end)
          end)
        end)
      end)
    end)
  end)
end)

step('dismiss clears it, and it stays cleared', function(next)
  keys('<CR>r')
  expect_ghost('eturn foo(a)\n    # done', 3000, function()
    keys(keymaps.dismiss)
    wait('no ghost text', 200, function()
      return ghost() == nil
    end, function()
      expect_none(400, next)
    end)
  end)
end)

if extmark then
  step('moving the cursor clears it at once', function(next)
    keys('e')
    expect_ghost('turn foo(a)\n    # done', 3000, function()
      keys('<Left>')
      wait('no ghost text', DELAY_MS, function()
        return ghost() == nil
      end, next)
    end)
  end)

  step('leaving insert mode clears it', function(next)
    keys('<End>')
    expect_ghost('turn foo(a)\n    # done', 3000, function()
      keys('<Esc>')
      wait('no ghost text', 200, function()
        return ghost() == nil
      end, next)
    end)
  end)

  step('an answer for text since changed is dropped, its request cancelled', function(next)
    local cancels = #received('$/cancelRequest')
    keys('A')
    -- type on past the debounce: the request for "re" is in flight when "x" comes
    vim.defer_fn(function()
      keys('x')
      vim.defer_fn(function() -- once "x" is typed (no ghost text since <Esc>)
        expect_none(DELAY_MS * 2, function()
          if #received('$/cancelRequest') <= cancels then
            error('no $/cancelRequest was sent')
          end
          next()
        end)
      end, 20)
    end, 50 + DELAY_MS / 2)
  end)
end

vim.defer_fn(function()
  run(1)
end, 0)
