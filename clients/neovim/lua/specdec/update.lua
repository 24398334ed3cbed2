-- Keeping the venv that :SpecdecInstall made (install.lua) on the plugin's own code. When the plugin's
-- checkout has moved to another commit since speccomplete went into the venv, the server starts from the
-- venv as it is, speccomplete is installed again from the checkout in the background (install.lua's own
-- step, one Neovim at a time: its lock), and the client restarts onto it between requests.
--
-- What tells that the checkout changed: its git commit (HEAD), recorded in stdpath('data')/specdec/
-- installed.json at each install. A plugin manager updates a plugin by checking out another commit, so the
-- commit changes exactly when the code does, and reading it is one short `git rev-parse`, in a job, off the
-- start's path. Hashing the Python files instead would walk hundreds of files at every start and see a
-- touch as a change. Edits not committed are not seen (:SpecdecInstall installs them); a copy that is not
-- a git checkout, or no git, has no commit: nothing is updated then.
local install = require('specdec.install')
local server = require('specdec.server')

local uv = vim.uv or vim.loop

local M = {}

-- A pause this long with no request pending is one between two bursts of typing: the restart goes then.
M.QUIET_MS = 1500
M.POLL_MS = 100
-- How long a lock held by another Neovim (updating the venv itself) is waited for, looking every LOCK_POLL_MS.
M.LOCK_POLL_MS = 2000
M.LOCK_WAIT_MS = 30 * 60 * 1000
-- A load that takes longer than this (a first conversion of a large model) is not waited for.
M.LOAD_WAIT_MS = 10 * 60 * 1000

local checked = false

-- Whether the venv needs installing again: the checkout is at `commit` (nil: unknown, nothing to compare)
-- and the venv's marker records another one, or none (a venv installed before markers were written).
function M.outdated(marker, commit)
  return commit ~= nil and (marker == nil or marker.commit ~= commit)
end

-- Calls `fn()` once `cond()` holds, looking every `poll_ms`, or once `timeout_ms` passed.
local function when(cond, poll_ms, timeout_ms, fn)
  local deadline = uv.now() + timeout_ms
  local function look()
    if cond() or uv.now() >= deadline then
      return fn()
    end
    vim.defer_fn(look, poll_ms)
  end
  look()
end

-- Calls `fn(client)` once the client `get_client()` returns has had no request pending for `quiet_ms`
-- (looking every `poll_ms`); at once when there is no client. A restart then cuts off no answer that a
-- display is waiting for.
function M.when_idle(get_client, quiet_ms, poll_ms, fn)
  local quiet_since = nil
  local function look()
    local client = get_client()
    if client and server.pending(client) > 0 then
      quiet_since = nil
    else
      quiet_since = quiet_since or uv.now()
      if not client or uv.now() - quiet_since >= quiet_ms then
        return fn(client)
      end
    end
    vim.defer_fn(look, poll_ms)
  end
  look()
end

local function venv_server(client)
  local cmd = client and client.config and client.config.cmd
  return type(cmd) == 'table' and cmd[1] == install.executable()
end

-- Restart the client between requests, if it runs the venv's server, then say once that it was updated.
function M.restart_when_idle(options, on_attach, commit)
  local said = string.format('specdec: updated the server to the plugin at %s', commit:sub(1, 12))
  M.when_idle(server.client, M.QUIET_MS, M.POLL_MS, function(client)
    if not venv_server(client) then -- not started yet, or another server: it starts on the new files
      return vim.notify(said, vim.log.levels.INFO)
    end
    server.restart(options, on_attach, function()
      vim.notify(said .. '; restarted it', vim.log.levels.INFO)
    end)
  end)
end

-- Takes the lock, waiting while another Neovim holds it (it may be updating the venv itself), then
-- `fn(release)`; nothing if it is not free within LOCK_WAIT_MS.
local function with_lock(fn)
  local release
  when(function()
    release = install.lock()
    return release ~= nil
  end, M.LOCK_POLL_MS, M.LOCK_WAIT_MS, function()
    if release then
      fn(release)
    end
  end)
end

-- Install speccomplete from the checkout at `commit` into the venv, in the background, then restart the
-- client onto it. A failure leaves the venv as it was (pip puts the old files back) and its marker too,
-- so the next start tries again.
function M.update(commit, options, on_attach)
  with_lock(function(release)
    if not M.outdated(install.read_marker(), commit) then -- another Neovim updated it meanwhile
      release()
      return M.restart_when_idle(options, on_attach, commit)
    end
    local repo = install.repo()
    local started = install.run_steps(install.update_plan({ repo = repo }), false, function(ok, err)
      if ok then
        install.write_marker(commit, repo)
      end
      release()
      if not ok then
        return vim.notify('specdec: updating the server failed; the installed one keeps running, and the next '
          .. 'start tries again: ' .. err, vim.log.levels.WARN)
      end
      M.restart_when_idle(options, on_attach, commit)
    end)
    if not started then -- an install of this Neovim's own (:SpecdecInstall) runs: it installs this checkout
      release()
    end
  end)
end

-- At start (setup(), or lsp/specdec.lua), once per Neovim: when the server is the venv's and the plugin's
-- checkout moved on since it was installed, the update above, after the server has loaded its models (the
-- load imports some of speccomplete's modules as it goes, and pip replacing them meanwhile could break it).
function M.check(options, on_attach)
  local executable = install.executable()
  if checked or options.cmd or not executable or server.find_executable() ~= executable then
    return
  end
  checked = true
  install.commit(install.repo(), function(commit)
    if not M.outdated(install.read_marker(), commit) then
      return
    end
    when(function()
      return not server.client() or require('specdec').status.state ~= 'loading'
    end, 500, M.LOAD_WAIT_MS, function()
      M.update(commit, options, on_attach)
    end)
  end)
end

return M
