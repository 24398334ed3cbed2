-- What the headless Neovim drivers (neovim_test.lua, neovim_logic_test.lua, neovim_install_test.lua) share:
-- their lines on stderr, failing the test (the reason on stderr, then exit 1), and waiting for a condition.
-- Each driver loads it from its own folder, whatever Neovim's working directory (test_neovim_install.py runs
-- the driver of a fresh clone from the repo root):
--   local driver = dofile(vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h') .. '/neovim_driver.lua')
--   driver.setup({ label = '[nvim 0.11 logic]' })
-- Neovim 0.7 and later: vim.loop, vim.defer_fn, vim.cmd.
local M = {}

local options = {
  label = '[nvim]', -- the prefix of the driver's lines on stderr
  on_fail = nil, -- run before exiting on a failure (to save what the Python side keeps as artifacts)
  on_timeout = nil, -- returns what to add to a timed-out wait's reason (the state it was waiting on)
  catch = false, -- an error raised by a wait's `next` fails the test; otherwise it is raised (Neovim reports it)
}

function M.setup(opts)
  options = vim.tbl_extend('force', options, opts)
end

function M.log(msg)
  io.stderr:write(options.label .. ' ' .. msg .. '\n')
end

-- The reason on stderr, then Neovim exits with status 1.
function M.fail(msg)
  M.log('FAIL: ' .. msg)
  if options.on_fail then
    local ok, err = pcall(options.on_fail)
    if not ok then
      M.log('saving the artifacts failed: ' .. tostring(err))
    end
  end
  vim.cmd('cquit 1')
end

-- Runs fn; a Lua error fails the test instead of leaving Neovim waiting.
function M.guarded(fn, ...)
  local ok, err = pcall(fn, ...)
  if not ok then
    M.fail('error: ' .. tostring(err))
  end
end

-- Polls `predicate` every `interval_ms` (50 if left out) until it returns a true value, then calls `next`
-- with that value; fails the test after `timeout_ms`, with the predicate's error if it raised one. The
-- first poll is at once; the later ones come from timers, so the event loop runs between them and keys
-- fed with nvim_feedkeys are typed, LSP messages handled (vim.wait would hold the keys until it returned).
--   wait_for(what, predicate, timeout_ms, next)
--   wait_for(what, predicate, timeout_ms, interval_ms, next)
function M.wait_for(what, predicate, timeout_ms, interval_ms, next)
  if next == nil and type(interval_ms) == 'function' then
    interval_ms, next = nil, interval_ms
  end
  interval_ms = interval_ms or 50
  local deadline = vim.loop.now() + timeout_ms
  local function poll()
    local ok, value = pcall(predicate)
    if ok and value then
      if options.catch then
        return M.guarded(next, value)
      end
      return next(value)
    end
    if vim.loop.now() > deadline then
      return M.fail('timed out waiting for ' .. what .. (ok and '' or (': ' .. tostring(value)))
        .. (options.on_timeout and options.on_timeout() or ''))
    end
    vim.defer_fn(poll, interval_ms)
  end
  poll()
end

return M
