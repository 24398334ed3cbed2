-- Headless: a new user's first minute in Neovim, in one session. greet.py is open and require('specdec').setup()
-- finds no server anywhere (it says so); :SpecdecInstall makes the venv and starts the server it installed for the
-- open buffer; then the end of a line is typed key by key and ghost text must come by itself.
--
-- Run by clients/tests/test_neovim_install.py, with a clean $HOME:
--   SPECDEC_TEST_DIR=/tmp/x nvim --headless -u NONE -i NONE --cmd 'set rtp^=clients/neovim' \
--     -c 'luafile clients/tests/neovim_install_test.lua'
-- Writes $SPECDEC_TEST_DIR/install.json (milliseconds from the install's start: the install done, the server
-- ready, the first ghost text; and that text) and exits 0, or exits 1 with the reason on stderr.
local dir = assert(os.getenv('SPECDEC_TEST_DIR'), 'SPECDEC_TEST_DIR must be set')
local TIMEOUT_MS = 600000
local TYPING_GAP_MS = 60
local POLL_MS = 100

-- fail and wait_for, shared with the other drivers (neovim_driver.lua), from this file's folder: the clone's,
-- while Neovim runs in the repo root
local driver = dofile(vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h') .. '/neovim_driver.lua')
driver.setup({ label = '[neovim install]' })
local fail, wait_for = driver.fail, driver.wait_for

-- The ghost text the plugin draws (its extmark's virtual text), or nil.
local function ghost(bufnr)
  local ns = vim.api.nvim_get_namespaces()['specdec.ghost']
  for _, mark in ipairs(ns and vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true }) or {}) do
    local parts = {}
    for _, chunk in ipairs(mark[4].virt_text or {}) do
      table.insert(parts, chunk[1])
    end
    if #parts > 0 then
      return table.concat(parts)
    end
  end
end

vim.cmd('filetype on')
vim.o.swapfile = false
local file = dir .. '/greet.py'
vim.fn.writefile({ 'def greet(name):', '    message = "Hello, "' }, file)
vim.cmd('edit ' .. vim.fn.fnameescape(file))
local bufnr = vim.api.nvim_get_current_buf()
local specdec = require('specdec')
specdec.setup() -- the defaults: on 0.11 ghost text drawn by the plugin (extmark)
if specdec.status.state ~= 'missing' then
  fail('setup found a server before the install: ' .. vim.inspect(specdec.status))
end

local started = vim.loop.now()
local times = {}
local ok_started = require('specdec.install').install(function(ok)
  if not ok then
    return fail(':SpecdecInstall failed; its log: ' .. require('specdec.install').log_path())
  end
  times.installed_ms = vim.loop.now() - started
  wait_for('the installed server, ready', function()
    return specdec.status.state == 'ready' and specdec.client(bufnr) ~= nil
  end, TIMEOUT_MS, POLL_MS, function()
    times.ready_ms = vim.loop.now() - started
    vim.api.nvim_win_set_cursor(0, { 2, 0 })
    vim.api.nvim_feedkeys('A', 'nt', false)
    local typed, k = ' + ', 0
    local function step()
      k = k + 1
      if k <= #typed then
        vim.api.nvim_feedkeys(typed:sub(k, k), 'nt', false)
        return vim.defer_fn(step, TYPING_GAP_MS)
      end
      wait_for('ghost text', function()
        return ghost(bufnr)
      end, TIMEOUT_MS, POLL_MS, function(text)
        times.ghost_ms = vim.loop.now() - started
        times.ghost = text
        vim.fn.writefile({ vim.fn.json_encode(times) }, dir .. '/install.json')
        vim.cmd('qall!')
      end)
    end
    step()
  end)
end)
if not ok_started then
  fail(':SpecdecInstall did not start')
end
