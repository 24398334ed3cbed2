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
local POLL_MS = 20 -- how often a wait looks again: well under DELAY_MS

-- log, fail and wait_for, shared with the other drivers (from this file's folder)
local driver = dofile(vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h') .. '/neovim_driver.lua')
driver.setup({
  label = string.format('[nvim %d.%d %s logic]', vim.version().major, vim.version().minor, display_option),
})
local log, fail, wait_for = driver.log, driver.fail, driver.wait_for

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

-- The ghost text shown, from its extmarks (the plugin's or Neovim's), in buffer order, and the first
-- extmark's details. A completion that retypes the closers after the cursor is drawn in parts around
-- them (the plugin's inline marks): the parts are joined, "|" where a buffer character sits between.
local function ghost()
  local namespaces = vim.api.nvim_get_namespaces()
  for _, name in ipairs({ 'specdec.ghost', 'nvim.lsp.inline_completion' }) do
    local ns = namespaces[name]
    local marks = ns and vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true }) or {}
    if #marks > 0 then
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
      local first, virt_lines = {}, {}
      for _, mark in ipairs(marks) do
        table.insert(first, text_of(mark[4].virt_text))
        for _, virt_line in ipairs(mark[4].virt_lines or {}) do
          table.insert(virt_lines, text_of(virt_line))
        end
      end
      local lines = { table.concat(first, '|') }
      vim.list_extend(lines, virt_lines)
      return table.concat(lines, '\n'), marks[1][4]
    end
  end
end

local function keys(s)
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(s, true, false, true), 'mt', false)
end

-- A wait that times out also says the ghost text shown and the line, as they are then.
driver.setup({
  on_timeout = function()
    return '; ghost text ' .. vim.inspect(ghost()) .. ', line ' .. vim.inspect(vim.api.nvim_get_current_line())
  end,
})

-- Each step gets `next`; `wait_for(what, cond, ms, POLL_MS, then)` polls without blocking the event loop.
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

local function expect_ghost(text, ms, next)
  wait_for('ghost text ' .. vim.inspect(text), function()
    return ghost() == text
  end, ms or 2000, POLL_MS, next)
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
    vim.defer_fn(poll, POLL_MS)
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
  wait_for('the buffer-local keys', function()
    local map = vim.fn.maparg(keymaps.accept, 'i', false, true)
    return map.buffer == 1 and map.desc and map.desc:find('^specdec: ')
  end, 10000, POLL_MS, function()
    -- one debounce: the display waits for the pause (debounce_ms), so the server is asked not to wait again
    local options = received('initialize')[1].params.initializationOptions
    if options.debounceMs ~= 0 then
      error('initializationOptions ' .. vim.inspect(options))
    end
    -- by default extmark asks at each key and the server waits; the other displays wait themselves
    local config = require('specdec.config')
    local cases = {
      { { display = 'extmark' }, nil },
      { { display = 'extmark', debounce_ms = 150 }, 0 },
      { { display = 'native' }, 0 },
      { { display = 'popup' }, 0 },
      { { display = 'extmark', debounce_ms = 150, init_options = { debounceMs = 80 } }, 80 },
    }
    for _, case in ipairs(cases) do
      local sent = config.init_options(case[1]).debounceMs
      if sent ~= case[2] then
        error('debounceMs ' .. tostring(sent) .. ' for ' .. vim.inspect(case[1]))
      end
    end
    next()
  end)
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

step('the statusline shows the wait measured here, not the server\'s', function(next)
  -- the fake server answers after DELAY_MS and says it took 0 ms
  local p50 = require('specdec.wait').p50()
  local shown = specdec.statusline():match('(%d+)ms$')
  if p50 == nil or p50 < DELAY_MS or p50 > 10 * DELAY_MS or tonumber(shown) ~= math.floor(p50 + 0.5) then
    error('wait p50 ' .. tostring(p50) .. ', statusline ' .. specdec.statusline())
  end
  next()
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
  wait_for('no request in flight', function()
    return not (extmark and require('specdec.trigger').busy(0))
  end, 2000, POLL_MS, function()
    keys(keymaps.accept_word)
    wait_for('the word', function()
      return vim.api.nvim_get_current_line() == '    return'
    end, 1000, POLL_MS, function()
      expect_ghost(' foo(a)\n    # done', 3000, function()
        keys(keymaps.accept_line)
        wait_for('the rest of the line', function()
          return vim.api.nvim_get_current_line() == '    return foo(a)'
        end, 1000, POLL_MS, function()
          expect_ghost('\n    # done', 3000, function()
            if #received('workspace/executeCommand') ~= 0 then
              error('a command ran for a part of the completion')
            end
            keys(keymaps.accept_line)
            wait_for('the next line', function()
              return vim.api.nvim_buf_line_count(0) == 3
            end, 1000, POLL_MS, function()
              expect_lines({ 'def f(a):', '    return foo(a)', '    # done' })
              wait_for('the accept command', function()
                return #received('workspace/executeCommand') == 1
              end, 2000, POLL_MS, next)
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
    wait_for('no ghost text', function()
      return ghost() == nil
    end, 200, POLL_MS, function()
      expect_none(400, next)
    end)
  end)
end)

if extmark then
  step('moving the cursor clears it at once', function(next)
    keys('e')
    expect_ghost('turn foo(a)\n    # done', 3000, function()
      keys('<Left>')
      wait_for('no ghost text', function()
        return ghost() == nil
      end, DELAY_MS, POLL_MS, next)
    end)
  end)

  step('leaving insert mode clears it', function(next)
    keys('<End>')
    expect_ghost('turn foo(a)\n    # done', 3000, function()
      keys('<Esc>')
      wait_for('no ghost text', function()
        return ghost() == nil
      end, 200, POLL_MS, next)
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

-- An auto-pairs mapping like nvim-autopairs': `(` types `()` and leaves the cursor between them.
vim.cmd('inoremap ( ()<Left>')

step('a completion past the auto-closed bracket: drawn around it, accepted over it', function(next)
  local commands = #received('workspace/executeCommand')
  keys('<Esc>oprint(')
  -- the item: insertText '"hi", a)  # done', its range over the ")" after the cursor. The plugin draws
  -- it in two parts, before and after the ")" (inline marks; the 0.9 overlay draws the ")" itself
  -- between its parts); Neovim 0.12 overlays the whole text from the cursor.
  local function drawn(text) -- text: the item's rest, ")" included
    if display == 'native' then
      return text
    end
    return (text:gsub('%)', require('specdec.ghost').has_inline() and '|' or ''))
  end
  expect_ghost(drawn('"hi", a)  # done'), 3000, function()
    if vim.api.nvim_get_current_line() ~= '    print()' then -- indented as the line above (autoindent)
      error('typing gave ' .. vim.inspect(vim.api.nvim_get_current_line()))
    end
    keys(keymaps.accept_word)
    wait_for('the first word, before the ")"', function()
      return vim.api.nvim_get_current_line() == '    print(")'
    end, 1000, POLL_MS, function()
      expect_ghost(drawn('hi", a)  # done'), 3000, function()
        keys(keymaps.accept)
        wait_for('the whole, over the ")"', function()
          return vim.api.nvim_get_current_line() == '    print("hi", a)  # done'
        end, 1000, POLL_MS, function()
          if vim.api.nvim_win_get_cursor(0)[2] ~= #'    print("hi", a)  # done' then
            error('the cursor is at ' .. vim.inspect(vim.api.nvim_win_get_cursor(0)))
          end
          wait_for('the accept command', function()
            return #received('workspace/executeCommand') == commands + 1
          end, 2000, POLL_MS, next)
        end)
      end)
    end)
  end)
end)

if extmark then
  step('asked for, an empty answer says why', function(next)
    keys('<Esc>oreturn 2')
    wait_for('the typed line, nothing shown', function()
      return vim.api.nvim_get_current_line() == '    return 2' and not require('specdec.trigger').busy(0)
        and ghost() == nil
    end, 2000, POLL_MS, function()
      vim.cmd('messages clear')
      keys(keymaps.next)
      wait_for('the reason in the message area', function()
        return vim.fn.execute('messages'):find('specdec: nothing to offer (end of a finished line)', 1, true)
      end, 2000, POLL_MS, next)
    end)
  end)
end

step('ghost-text highlights have a terminal colour', function(next)
  local groups = { 'SpecdecGhostText', 'SpecdecGhostTextHint' }
  if vim.fn.hlexists('ComplHint') == 1 then -- 0.12+: its own display's
    table.insert(groups, 'ComplHint')
  end
  for _, group in ipairs(groups) do
    if vim.fn.synIDattr(vim.fn.synIDtrans(vim.fn.hlID(group)), 'fg', 'cterm') == '' then
      error(group .. ' has no ctermfg: ' .. vim.fn.execute('highlight ' .. group))
    end
  end
  -- a colorscheme's (or the user's) own definition wins over specdec's default
  vim.cmd('highlight SpecdecGhostText ctermfg=5')
  vim.api.nvim_exec_autocmds('ColorScheme', {})
  if vim.fn.synIDattr(vim.fn.hlID('SpecdecGhostText'), 'fg', 'cterm') ~= '5' then
    error('SpecdecGhostText was overridden: ' .. vim.fn.execute('highlight SpecdecGhostText'))
  end
  next()
end)

step('the load shown as it goes, ready said once, and a missing server said', function(next)
  local before = specdec.status
  vim.cmd('messages clear')
  specdec._on_status({ state = 'loading', message = 'converting m.gguf: tensors (40%)' })
  specdec._on_status({ state = 'ready', message = 'm on cpu' })
  specdec._on_status({ state = 'ready', message = 'm on cpu' })
  wait_for('"ready" said', function()
    return vim.fn.execute('messages'):find('specdec: ready (m on cpu)', 1, true)
  end, 2000, POLL_MS, function()
    local messages = vim.fn.execute('messages')
    local _, readies = messages:gsub('specdec: ready %(m on cpu%)', '')
    if readies ~= 1 then
      return fail('"ready" said ' .. readies .. ' times: ' .. messages)
    end
    if messages:find('converting m.gguf', 1, true) then
      return fail('the progress went into :messages: ' .. messages)
    end
    local server = require('specdec.server')
    local find = server.find_executable
    server.find_executable = function()
      return nil
    end
    local found = specdec.check_server({})
    server.find_executable = find
    if found or not specdec.statusline():find('specdec missing', 1, true) then
      return fail('no server, yet the statusline says ' .. specdec.statusline())
    end
    wait_for('a missing server said', function()
      return vim.fn.execute('messages'):find('no specdec server found; :SpecdecInstall sets one up', 1, true)
    end, 2000, POLL_MS, function()
      specdec.status = before
      next()
    end)
  end)
end)

step(':SpecdecInstall: its plan, and the finder preferring its venv', function(next)
  local install = require('specdec.install')
  local pip = { '/v/bin/python', '-m', 'pip', 'install', '--disable-pip-version-check', '--no-compile' }
  local cpu = install.plan({ python = '/usr/bin/python3', nvidia = false, venv = '/v', repo = '/r' })
  local want = {
    { title = 'creating /v', cmd = { '/usr/bin/python3', '-m', 'venv', '/v' } },
    {
      title = 'installing PyTorch, CPU build (torch==2.13.0)',
      cmd = vim.list_extend(vim.deepcopy(pip), { '--retries', '1', '--timeout', '15', '--no-deps', 'torch==2.13.0',
        '--index-url', 'https://download.pytorch.org/whl/cpu' }),
    },
    -- a server start's modules compiled as the next step installs them; it does not wait for this
    { title = "compiling the server's modules as they are installed, in the background",
      cmd = { '/v/bin/python', '/r/clients/setup/compile_ahead.py' }, background = true },
    { title = 'installing speccomplete from /r', cmd = vim.list_extend(vim.deepcopy(pip), { '/r' }) },
  }
  if not vim.deep_equal(cpu, want) then
    error('plan ' .. vim.inspect(cpu))
  end
  -- the script the background step runs is where the plan says, in this checkout
  if not (vim.uv or vim.loop).fs_stat(install.compile_ahead(install.repo())) then
    error('no compile-ahead script at ' .. install.compile_ahead(install.repo()))
  end
  local gpu = install.plan({ python = '/usr/bin/python3', nvidia = true, venv = '/v', repo = '/r' })
  if not vim.deep_equal(gpu, { want[1], want[3], want[4] }) then -- with a GPU, PyPI's torch comes with speccomplete
    error('plan with a GPU ' .. vim.inspect(gpu))
  end
  -- an update of the venv is its speccomplete step again (pip builds a folder again at the same version)
  local update = install.update_plan({ venv = '/v', repo = '/r' })
  if not vim.deep_equal(update, { want[4] }) then
    error('update plan ' .. vim.inspect(update))
  end
  -- the repository is the one the plugin lives in
  if install.repo() ~= vim.fn.getcwd() then
    error('repo ' .. install.repo() .. ', expected ' .. vim.fn.getcwd())
  end
  local python = install.find_python()
  if not python then
    error('no Python 3.11+ found (tried ' .. table.concat(install.PYTHONS, ', ') .. ')')
  end
  -- with the venv in place, its specdec is found first
  local venv = install.venv
  install.venv = function()
    return dir .. '/venv'
  end
  vim.fn.mkdir(dir .. '/venv/bin', 'p')
  vim.fn.writefile({ '#!/bin/sh' }, dir .. '/venv/bin/specdec')
  vim.fn.setfperm(dir .. '/venv/bin/specdec', 'rwxr-xr-x')
  local found, how = require('specdec.server').find_executable()
  install.venv = venv
  if found ~= dir .. '/venv/bin/specdec' or not how:find('SpecdecInstall', 1, true) then
    error('found ' .. tostring(found) .. ' ' .. tostring(how))
  end
  if vim.fn.exists(':SpecdecInstall') ~= 2 then
    error(':SpecdecInstall is not defined')
  end
  next()
end)

step('a finished :SpecdecInstall starts the server it installed, unless cmd names another', function(next)
  local install, server, config = require('specdec.install'), require('specdec.server'), require('specdec.config')
  local start, find, options, status = server.start, server.find_executable, config.options, specdec.status
  local started = {}
  server.start = function(opts, on_attach)
    table.insert(started, { cmd = server.cmd(opts), on_attach = on_attach })
  end
  server.find_executable = function()
    return '/venv/bin/specdec', 'in the venv :SpecdecInstall made'
  end
  local function restore()
    server.start, server.find_executable, config.options, specdec.status = start, find, options, status
  end
  config.options = vim.deepcopy(options)
  config.options.cmd = nil -- the default: the server the finder finds
  install.run({ { title = 'nothing to install', cmd = { 'true' } } }, function(ok)
    local ours = #started == 1 and vim.deep_equal(started[1].cmd, { '/venv/bin/specdec', 'serve' })
    config.options = vim.tbl_extend('force', options, { cmd = { 'my-server' } })
    install.run({ { title = 'nothing to install', cmd = { 'true' } } }, function(ok2)
      restore()
      if not (ok and ok2 and ours and #started == 1) then
        return fail('started after the installs: ' .. vim.inspect(started))
      end
      if (vim.fn.exists('##LspAttach') == 0) ~= (started[1].on_attach ~= nil) then
        return fail('on_attach where LspAttach is missing only: ' .. vim.inspect(started[1]))
      end
      next()
    end)
  end)
end)

step('a failed install step stops the background steps begun before it', function(next)
  local install = require('specdec.install')
  local marker = 'sleep 31.4159' -- a process no one else runs, to look for
  local steps = {
    { title = 'in the background', cmd = { 'sh', '-c', marker }, background = true },
    { title = 'fails', cmd = { 'false' } },
  }
  install.run_steps(steps, false, function(ok, err)
    if ok or not err:find('fails failed') then
      return fail('the failing step: ' .. tostring(err))
    end
    local gone = vim.wait(5000, function()
      return vim.fn.system({ 'pgrep', '-f', marker }) == ''
    end, 100)
    if not gone then
      vim.fn.system({ 'pkill', '-f', marker })
      return fail('the background step still runs after the failure')
    end
    next()
  end)
end)

-- The update.lua tests run against install.lua's files in a folder of the test's own, and a fresh update.lua
-- (its once-per-Neovim check not yet done); `restore()` puts the stubbed functions back.
local function stubbed(modules, stubs)
  local saved = {}
  for name, fns in pairs(stubs) do
    saved[name] = {}
    for key, fn in pairs(fns) do
      saved[name][key] = modules[name][key]
      modules[name][key] = fn
    end
  end
  return function()
    for name, fns in pairs(saved) do
      for key, fn in pairs(fns) do
        modules[name][key] = fn
      end
    end
  end
end

local function fresh_update()
  package.loaded['specdec.update'] = nil
  return require('specdec.update')
end

step("the venv's staleness: the marker's commit against the checkout's, and the lock", function(next)
  local install = require('specdec.install')
  local update = fresh_update()
  local data = dir .. '/update-data'
  vim.fn.delete(data, 'rf')
  local restore = stubbed({ install = install }, { install = { dir = function() return data end } })
  local ok, err = pcall(function()
    -- outdated: another commit, or no marker (a venv from before markers); unknown commit: never
    local cases = {
      { nil, 'abc', true }, { { commit = 'abc' }, 'abc', false }, { { commit = 'abc' }, 'def', true },
      { { commit = 'abc' }, nil, false }, { nil, nil, false },
    }
    for _, c in ipairs(cases) do
      if update.outdated(c[1], c[2]) ~= c[3] then
        error('outdated(' .. vim.inspect(c[1]) .. ', ' .. vim.inspect(c[2]) .. ') is not ' .. tostring(c[3]))
      end
    end
    if install.read_marker() ~= nil then
      error('a marker before any install')
    end
    install.write_marker('abc', '/r')
    local marker = install.read_marker()
    if not (marker and marker.commit == 'abc' and marker.repo == '/r') then
      error('marker ' .. vim.inspect(marker))
    end
    -- the lock: one holder; a live one's (pid 1) refuses, also :SpecdecInstall; a dead one's is taken over
    local release = install.lock()
    local again, holder = install.lock()
    if not release or again or holder ~= vim.fn.getpid() then
      error('lock taken twice: ' .. vim.inspect({ release, again, holder }))
    end
    release()
    if vim.fn.filereadable(install.lock_path()) == 1 then
      error('the lock stayed after its release')
    end
    vim.fn.writefile({ '1' }, install.lock_path())
    again, holder = install.lock()
    if again or holder ~= 1 then
      error("pid 1's lock was not respected: " .. vim.inspect({ again, holder }))
    end
    if install.install() ~= false then
      error(':SpecdecInstall ran while another Neovim held the lock')
    end
    vim.fn.writefile({ '4194305' }, install.lock_path()) -- above Linux's pid_max: no such process
    release = install.lock()
    if not release or vim.fn.readfile(install.lock_path())[1] ~= tostring(vim.fn.getpid()) then
      error("a dead Neovim's lock was not taken over")
    end
    release()
  end)
  restore()
  if not ok then
    error(err)
  end
  wait_for(':SpecdecInstall saying who holds the lock', function()
    return vim.fn.execute('messages'):find('another Neovim (pid 1) is installing or updating', 1, true)
  end, 2000, POLL_MS, function()
    -- the checkout's commit, read in a job
    local head = vim.trim(vim.fn.system({ 'git', 'rev-parse', 'HEAD' }))
    local got = false
    install.commit(vim.fn.getcwd(), function(commit)
      got = { commit }
    end)
    wait_for('the commit', function()
      return got
    end, 5000, POLL_MS, function()
      if got[1] ~= head then
        return fail('commit ' .. vim.inspect(got[1]) .. ', git says ' .. head)
      end
      install.commit(dir .. '/not-a-checkout', function(commit)
        got = { commit or 'none' }
      end)
      wait_for('no commit outside a checkout', function()
        return got[1] ~= head and got[1]
      end, 5000, POLL_MS, function(commit)
        if commit ~= 'none' then
          return fail('a commit outside a checkout: ' .. commit)
        end
        next()
      end)
    end)
  end)
end)

step('the restart waits until no request is pending, then a quiet moment', function(next)
  local update = fresh_update()
  local client = { requests = { [1] = { type = 'pending' }, [2] = { type = 'cancel' } } }
  local called, cleared = nil, nil
  local QUIET = 200
  update.when_idle(function()
    return client
  end, QUIET, 20, function(c)
    called = { at = vim.loop.now(), client = c }
  end)
  vim.defer_fn(function()
    if called then
      return fail('restarted with a request pending')
    end
    client.requests[1] = nil -- answered; the cancelled one's answer nobody waits for
    cleared = vim.loop.now()
    wait_for('the restart after the quiet moment', function()
      return called
    end, 3000, POLL_MS, function()
      if called.at - cleared < QUIET - 30 or called.client ~= client then -- timers fire a little early
        return fail(string.format('restarted %d ms after the last answer', called.at - cleared))
      end
      local none
      update.when_idle(function() end, QUIET, 20, function(c)
        none = { c }
      end)
      if not none or none[1] ~= nil then
        return fail('without a client it should go at once')
      end
      next()
    end)
  end, 500)
end)

-- The whole update with the steps stubbed: the checkout moved on (the marker says another commit), the server
-- is the venv's; the update's steps run, the marker then says HEAD, the lock is free again, the client
-- restarts only once its request is answered, and one INFO message says so. Then a failing update: the marker
-- stays, a warning says so, no restart.
step('an update in the background, then the restart between requests; a failed one keeps the server', function(next)
  local install, server = require('specdec.install'), require('specdec.server')
  local update = fresh_update()
  local data = dir .. '/update-flow'
  vim.fn.delete(data, 'rf')
  local head = vim.trim(vim.fn.system({ 'git', 'rev-parse', 'HEAD' }))
  local exe = '/venv/bin/specdec'
  local client = { id = 1, config = { cmd = { exe, 'serve' } }, requests = { [7] = { type = 'pending' } } }
  local ran, restarts, notes = {}, {}, {}
  local steps = { { title = 'updating', cmd = { 'true' } } }
  local restore = stubbed({ install = install, server = server, vim = vim }, {
    install = {
      dir = function() return data end,
      executable = function() return exe end,
      update_plan = function(opts)
        table.insert(ran, opts.repo)
        return steps
      end,
    },
    server = {
      find_executable = function() return exe, 'in the venv :SpecdecInstall made' end,
      client = function() return client end,
      restart = function(_, _, done)
        table.insert(restarts, vim.loop.now())
        done(true)
      end,
    },
    vim = {
      notify = function(msg, level)
        table.insert(notes, { msg = msg, level = level })
      end,
    },
  })
  local status = specdec.status
  specdec.status = { state = 'ready', message = '' }
  update.QUIET_MS = 100
  install.write_marker('0000000', '/old')
  local answered
  local function finish(err)
    restore()
    specdec.status = status
    if err then
      return fail(err)
    end
    next()
  end
  update.check({})
  wait_for('the update to run and the marker to say HEAD', function()
    local marker = install.read_marker()
    return marker and marker.commit == head
  end, 5000, POLL_MS, function()
    if #ran ~= 1 or ran[1] ~= install.repo() then
      return finish('the update ran ' .. vim.inspect(ran))
    end
    if vim.fn.filereadable(install.lock_path()) == 1 then
      return finish('the lock stayed after the update')
    end
    vim.defer_fn(function()
      if #restarts > 0 then
        return finish('restarted with a request pending')
      end
      client.requests[7] = nil
      answered = vim.loop.now()
      wait_for('the restart', function()
        return #restarts > 0 and #notes > 0
      end, 3000, POLL_MS, function()
        if restarts[1] - answered < 70 then
          return finish('restarted ' .. (restarts[1] - answered) .. ' ms after the answer')
        end
        if #notes ~= 1 or notes[1].level ~= vim.log.levels.INFO or not notes[1].msg:find('updated the server', 1, true) then
          return finish('messages ' .. vim.inspect(notes))
        end
        -- once per Neovim: a second check does nothing
        update.check({})
        -- a failing update: the marker stays, a warning, no restart
        update = fresh_update()
        update.QUIET_MS = 100
        steps = { { title = 'updating', cmd = { 'false' } } }
        install.write_marker('0000000', '/old')
        notes, restarts = {}, {}
        update.check({})
        wait_for('the failure said', function()
          return #notes > 0
        end, 5000, POLL_MS, function()
          vim.defer_fn(function()
            local marker = install.read_marker()
            if #ran ~= 2 then
              return finish('the checks ran the update ' .. #ran .. ' times, not 2')
            end
            if not (notes[1].level == vim.log.levels.WARN and notes[1].msg:find('keeps running', 1, true)) then
              return finish('messages ' .. vim.inspect(notes))
            end
            if marker.commit ~= '0000000' or #restarts > 0 then
              return finish('after a failure: marker ' .. vim.inspect(marker) .. ', restarts ' .. #restarts)
            end
            if vim.fn.filereadable(install.lock_path()) == 1 then
              return finish('the lock stayed after the failure')
            end
            finish()
          end, 300)
        end)
      end)
    end, 300)
  end)
end)

-- The restart itself, with the stand-in server: the client exits, and a new one attaches to the buffer.
step('server.restart: the old client exits, a new one attaches to the buffers open', function(next)
  local server, config = require('specdec.server'), require('specdec.config')
  local bufnr = vim.api.nvim_get_current_buf()
  local old = server.client(bufnr)
  if not old then
    error('no client attached to ' .. vim.api.nvim_buf_get_name(bufnr))
  end
  local restarted = false
  server.restart(config.options, vim.fn.exists('##LspAttach') == 0 and specdec.attach or nil, function(started)
    restarted = started
  end)
  wait_for('a new client attached', function()
    local new = server.client(bufnr)
    return restarted and new and new.id ~= old.id and not vim.lsp.get_client_by_id(old.id) and new
  end, 10000, POLL_MS, function(new)
    log('restarted: client ' .. old.id .. ' exited, ' .. new.id .. ' attached')
    next()
  end)
end)

-- The README's and :help's snippets, as written, in a fresh Neovim of this version: the sh block
-- that links the plugin into a package folder (with a $HOME of its own), then each Lua block as an
-- init.lua. A lazy.nvim spec by repository name needs lazy.nvim and is left out; one with `dir` runs as
-- lazy (0.8+) runs it (the folder on the runtimepath, then `config`); vim.lsp.config's needs 0.11.
step("the README's and :help's snippets run", function(next)
  local home = dir .. '/home'
  local function blocks(path, open, close)
    local found, current, kind = {}, nil, nil
    for _, line in ipairs(vim.fn.readfile(path)) do
      if current then
        if line:match(close) then
          table.insert(found, { kind = kind, text = table.concat(current, '\n') })
          current = nil
        else
          table.insert(current, line)
        end
      else
        kind = line:match(open)
        current = kind and {} or nil
      end
    end
    return found
  end
  local snippets = blocks('clients/neovim/README.md', '^```(%a+)$', '^```$')
  vim.list_extend(snippets, blocks('clients/neovim/doc/specdec.txt', '>(%a+)$', '^<'))
  local ran = 0
  for _, snippet in ipairs(snippets) do
    local text = snippet.text:gsub('/path/to/specdec', vim.fn.getcwd())
    if snippet.kind == 'lua' and text:match('^{') and text:find('dir = ', 1, true) then
      text = 'local spec = ' .. text .. '\nvim.opt.rtp:prepend(spec.dir)\nvim.cmd("runtime! plugin/specdec.lua")'
        .. '\nspec.config({ dir = spec.dir }, spec.opts)'
        .. "\nassert(vim.fn.filereadable(spec.dir .. '/doc/tags') == 1, 'no help tags')"
    end
    local lazy_spec = text:match('^local spec = ') ~= nil
    local skip = text:find('<owner>/<repo>', 1, true)
      or (lazy_spec and vim.fn.has('nvim-0.8') == 0) -- lazy.nvim needs 0.8
      or (text:find('vim.lsp.config', 1, true) and vim.fn.has('nvim-0.11') == 0)
    if snippet.kind == 'sh' and not skip then
      local out = vim.fn.system({ 'env', 'HOME=' .. home, 'sh', '-c', text })
      if vim.v.shell_error ~= 0 then
        error('sh snippet failed: ' .. text .. '\n' .. out)
      end
    elseif (snippet.kind == 'lua' or snippet.kind == 'vim') and not skip then
      local init = dir .. '/snippet-' .. ran .. '.' .. snippet.kind
      local mark = 'snippet ran to its end'
      local tail = snippet.kind == 'lua' and ('\nio.stdout:write(' .. vim.inspect(mark) .. ')')
        or ('\nlua io.stdout:write(' .. vim.inspect(mark) .. ')')
      vim.fn.writefile(vim.split(text .. tail, '\n', { plain = true }), init)
      local cmd = { 'env', '-u', 'XDG_DATA_HOME', '-u', 'XDG_CONFIG_HOME', 'HOME=' .. home, vim.v.progpath,
        '--headless', '-i', 'NONE', '-u', init, '+qall!' }
      if not text:find('packadd', 1, true) and not text:find('runtimepath', 1, true) then
        vim.list_extend(cmd, { '--cmd', 'packadd specdec' }) -- the plugin, as the install snippets add it
      end
      local out = vim.fn.system(cmd)
      if not out:find(mark, 1, true) then
        error('snippet failed on this Neovim:\n' .. text .. '\n' .. out)
      end
      ran = ran + 1
    end
  end
  if ran < 4 then
    error('only ' .. ran .. ' snippets found')
  end
  log(ran .. ' snippets ran')
  next()
end)

vim.defer_fn(function()
  run(1)
end, 0)
