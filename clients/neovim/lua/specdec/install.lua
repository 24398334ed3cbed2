-- :SpecdecInstall, the server without a terminal: a virtual environment of specdec's own in
-- stdpath('data')/specdec/venv, made with a Python 3.11+ found on the system (a venv, so PEP 668's
-- "externally managed" system Pythons are left alone), PyTorch's CPU build from PyTorch's index unless
-- nvidia-smi runs (PyPI's torch is the CUDA build, gigabytes a CPU has no use for), then speccomplete
-- from the repository this plugin lives in. server.lua's finder prefers this venv's specdec.
-- One Neovim at a time installs into or updates the venv (M.lock); the commit installed is recorded
-- (M.write_marker) so that update.lua can tell when the plugin's checkout moved on.
local M = {}

local uv = vim.uv or vim.loop

M.TORCH = 'torch==2.13.0'
M.CPU_INDEX = 'https://download.pytorch.org/whl/cpu'
M.PYTHONS = { 'python3.13', 'python3.12', 'python3.11', 'python3', 'python' }

-- stdpath('data')/specdec: the venv, the install log, the marker and the lock.
function M.dir()
  return vim.fn.stdpath('data') .. '/specdec'
end

function M.venv()
  return M.dir() .. '/venv'
end

function M.log_path()
  return M.dir() .. '/install.log'
end

-- The venv's specdec, if it is installed.
function M.executable()
  for _, rel in ipairs({ '/bin/specdec', '/Scripts/specdec.exe' }) do
    local path = M.venv() .. rel
    if vim.fn.executable(path) == 1 then
      return path
    end
  end
end

-- The repository holding this plugin (clients/neovim is two folders below its root).
function M.repo()
  return vim.fn.fnamemodify(require('specdec.server').plugin_dir(), ':h:h')
end

-- The first Python on $PATH that is 3.11 or later: its path and version ("3.11"), or nil.
function M.find_python()
  for _, name in ipairs(M.PYTHONS) do
    local path = vim.fn.exepath(name)
    if path ~= '' then
      local out = vim.fn.system({ path, '-c', 'import sys; print("%d.%d" % sys.version_info[:2])' })
      local major, minor = vim.trim(out):match('^(%d+)%.(%d+)$')
      major, minor = tonumber(major), tonumber(minor)
      if vim.v.shell_error == 0 and major and (major > 3 or (major == 3 and minor >= 11)) then
        return path, major .. '.' .. minor
      end
    end
  end
end

-- Whether an NVIDIA GPU answers (nvidia-smi runs and lists one).
function M.has_nvidia()
  if vim.fn.executable('nvidia-smi') == 0 then
    return false
  end
  vim.fn.system({ 'nvidia-smi', '-L' })
  return vim.v.shell_error == 0
end

-- `pip install` in the venv.
local function pip_install(venv)
  local python = venv .. (vim.fn.has('win32') == 1 and '/Scripts/python.exe' or '/bin/python')
  -- --no-compile: pip would byte-compile every module of torch and transformers (tens of seconds on a small
  -- CPU); Python compiles the ones the server imports on first use instead.
  return { python, '-m', 'pip', 'install', '--disable-pip-version-check', '--no-compile' }
end

-- speccomplete from the repository, with the dependencies it names that the venv lacks. A folder is
-- built and installed again even when the same version is installed (pip keeps an installed version
-- only for a wheel file), so the same step also updates it; torch and the rest stay.
local function speccomplete_step(venv, repo)
  return {
    title = 'installing speccomplete from ' .. repo,
    cmd = vim.list_extend(pip_install(venv), { repo }),
  }
end

-- Python compiles a module at its first import (--no-compile above), and a first server start imports some 2,000:
-- seconds of a 2-core machine's start. A background step (clients/setup/compile_ahead.py) compiles them as pip puts
-- them in, on the core pip leaves idle, at a lower priority, and stops once speccomplete is installed (or is stopped
-- where pip fails); what is not done when the server starts, the server compiles.
function M.compile_ahead(repo)
  return repo .. '/clients/setup/compile_ahead.py'
end

-- The steps, as { title, cmd[, background] } in order; a background step is started and not waited for.
-- opts: python (required), nvidia, venv, repo.
function M.plan(opts)
  local venv = opts.venv or M.venv()
  local pip = pip_install(venv)
  local repo = opts.repo or M.repo()
  local steps = { { title = 'creating ' .. venv, cmd = { opts.python, '-m', 'venv', venv } } }
  if not opts.nvidia then
    -- Only torch comes from the CPU index, with --no-deps: pip asks the one index for each package it
    -- resolves, so torch's dependencies come with speccomplete's from the usual index in the next step.
    -- That keeps the CPU index to one lookup, with one retry and a short timeout: where it cannot be
    -- reached, pip's own find-links or mirror (pip.conf) may still hold the wheel, in seconds.
    table.insert(steps, {
      title = 'installing PyTorch, CPU build (' .. M.TORCH .. ')',
      cmd = vim.list_extend(vim.deepcopy(pip), { '--retries', '1', '--timeout', '15', '--no-deps', M.TORCH,
        '--index-url', M.CPU_INDEX }),
    })
  end
  table.insert(steps, {
    title = "compiling the server's modules as they are installed, in the background",
    cmd = { pip[1], M.compile_ahead(repo) },
    background = true,
  })
  table.insert(steps, speccomplete_step(venv, repo))
  return steps
end

-- The update of an installed venv: its last step alone. opts: venv, repo.
function M.update_plan(opts)
  return { speccomplete_step(opts.venv or M.venv(), opts.repo or M.repo()) }
end

local function notify(msg, level)
  vim.schedule(function()
    vim.notify('specdec: ' .. msg, level or vim.log.levels.INFO)
  end)
end

local running = false

-- Run the steps one after another, each a job whose output goes to the install log. `announce`: a message
-- as each step starts. `done(ok, err)` at the end, `err` saying which step failed, with pip's last lines.
-- One run at a time in this Neovim: false if one is running.
function M.run_steps(steps, announce, done)
  if running then
    return false
  end
  running = true
  vim.fn.mkdir(M.dir(), 'p')
  local log = io.open(M.log_path(), 'w')
  local background = {} -- the background steps' jobs: stopped where a later step fails
  local function finish(ok, err)
    running = false
    if not ok then
      for _, job in ipairs(background) do
        pcall(vim.fn.jobstop, job)
      end
    end
    if log then
      log:close()
    end
    vim.schedule(function()
      done(ok, err)
    end)
  end
  local function step(i)
    local s = steps[i]
    if not s then
      return finish(true)
    end
    if announce then
      notify(string.format('[%d/%d] %s ...', i, #steps, s.title))
    end
    if log then
      log:write('$ ' .. table.concat(s.cmd, ' ') .. '\n')
    end
    local tail = {}
    local function collect(_, data)
      for _, line in ipairs(data or {}) do
        if line ~= '' then
          if log then
            log:write(line .. '\n')
          end
          table.insert(tail, line)
          if #tail > 5 then
            table.remove(tail, 1)
          end
        end
      end
    end
    if s.background then -- its output is not kept: the log may be closed before it ends
      local ok, job = pcall(vim.fn.jobstart, s.cmd)
      if ok and job > 0 then
        table.insert(background, job)
      end
      return step(i + 1)
    end
    local ok, job = pcall(vim.fn.jobstart, s.cmd, {
      on_stdout = collect,
      on_stderr = collect,
      on_exit = function(_, code)
        if code == 0 then
          return step(i + 1)
        end
        finish(false, string.format('%s failed (exit %d); the log is %s\n%s', s.title, code, M.log_path(),
          table.concat(tail, '\n')))
      end,
    })
    if not ok or job <= 0 then
      finish(false, s.title .. ': cannot run ' .. s.cmd[1])
    end
  end
  step(1)
  return true
end

-- :SpecdecInstall's run of the plan: a message as each step starts, then the server it installed started.
-- `done(ok)` at the end.
function M.run(steps, done)
  local started = M.run_steps(steps, true, function(ok, err)
    if ok then
      local started = require('specdec').start_installed()
      notify(string.format('installed %s; %s', M.executable() or M.venv(),
        started and 'starting it' or 'restart Neovim to start it'))
    else
      notify(err, vim.log.levels.ERROR)
    end
    if done then
      done(ok)
    end
  end)
  if not started then
    notify('an install is already running', vim.log.levels.WARN)
  end
  return started
end

-- The lock file: one Neovim at a time installs into or updates the venv.
function M.lock_path()
  return M.dir() .. '/venv.lock'
end

-- An hour: an install takes minutes. A lock older than this is stale even if its pid runs (a pid reused
-- since by another program, after a Neovim was killed mid-install).
M.LOCK_STALE_S = 3600

local function alive(pid)
  local ok, err = uv.kill(pid, 0) -- signal 0 only tests that the process exists
  return ok == 0 or (err ~= nil and err:find('EPERM', 1, true) ~= nil) -- EPERM: exists, another user's
end

local function read_file(path)
  local f = io.open(path, 'r')
  if not f then
    return nil
  end
  local text = f:read('*a')
  f:close()
  return text
end

-- Whether the lock at `path`, whose text is `text`, is stale: its process is gone, or it is older than
-- LOCK_STALE_S. Its holder writes its pid right after creating it: one still without a pid after ten
-- seconds was left by a Neovim that died between the two.
local function stale(path, text)
  local stat = uv.fs_stat(path)
  local age = stat and os.time() - stat.mtime.sec or 0
  local pid = tonumber(vim.trim(text))
  if not pid then
    return age > 10
  end
  return age > M.LOCK_STALE_S or not alive(pid)
end

-- Take the lock: a file created only if it does not exist (O_EXCL), holding this Neovim's pid. Returns a
-- function that releases it, or nil and the pid of the live Neovim holding it. A stale lock is taken over.
function M.lock()
  local path = M.lock_path()
  vim.fn.mkdir(M.dir(), 'p')
  local pid = vim.fn.getpid()
  for _ = 1, 3 do
    local fd = uv.fs_open(path, 'wx', 420)
    if fd then
      uv.fs_write(fd, tostring(pid), -1)
      uv.fs_close(fd)
      return function()
        -- Only our own: another Neovim that judged it stale may hold it now.
        if vim.trim(read_file(path) or '') == tostring(pid) then
          os.remove(path)
        end
      end
    end
    local seen = read_file(path)
    if seen and not stale(path, seen) then
      return nil, tonumber(vim.trim(seen))
    end
    if seen then
      -- Aside first (a rename is atomic): if another Neovim broke this stale lock and took it between our
      -- read and our rename, what went aside is its fresh lock, and it goes back.
      local aside = path .. '.' .. pid .. '.stale'
      if uv.fs_rename(path, aside) then
        if read_file(aside) ~= seen then
          uv.fs_rename(aside, path)
        else
          os.remove(aside)
        end
      end
    end
  end
  return nil, nil
end

-- The marker: the commit of the plugin's checkout that the venv's speccomplete was installed from.
function M.marker_path()
  return M.dir() .. '/installed.json'
end

function M.read_marker()
  local text = read_file(M.marker_path())
  local ok, marker = pcall(vim.fn.json_decode, text or '')
  return ok and type(marker) == 'table' and marker or nil
end

function M.write_marker(commit, repo)
  vim.fn.mkdir(M.dir(), 'p')
  vim.fn.writefile({ vim.fn.json_encode({ commit = commit, repo = repo, installed = os.date('!%Y-%m-%dT%H:%M:%SZ') }) },
    M.marker_path())
end

-- `done(commit)`: the commit checked out in `repo` (git rev-parse HEAD, in a job: nothing waits for it), or nil
-- where git or the checkout is missing.
function M.commit(repo, done)
  local out = {}
  local ok, job = pcall(vim.fn.jobstart, { 'git', '-C', repo, 'rev-parse', 'HEAD' }, {
    stdout_buffered = true,
    on_stdout = function(_, data)
      out = data or {}
    end,
    on_exit = function(_, code)
      local commit = code == 0 and (out[1] or ''):match('^%x+$') or nil
      vim.schedule(function()
        done(commit)
      end)
    end,
  })
  if not ok or job <= 0 then
    vim.schedule(function()
      done(nil)
    end)
  end
end

-- :SpecdecInstall
function M.install(done)
  local python, version = M.find_python()
  if not python then
    notify('no Python 3.11 or later on $PATH (tried ' .. table.concat(M.PYTHONS, ', ') .. ')', vim.log.levels.ERROR)
    return false
  end
  local release, holder = M.lock()
  if not release then
    local who = holder == vim.fn.getpid() and 'this Neovim' or string.format('another Neovim (pid %s)', holder or '?')
    notify(string.format('%s is installing or updating %s; try again once it is done (a stale lock: %s)', who,
      M.venv(), M.lock_path()), vim.log.levels.WARN)
    return false
  end
  local nvidia = M.has_nvidia()
  notify(string.format('installing into %s with Python %s (%s); PyTorch %s', M.venv(), version, python,
    nvidia and 'from PyPI (nvidia-smi found a GPU)' or 'CPU build'))
  local repo = M.repo()
  -- The commit is read as the install starts: the checkout pip builds from.
  M.commit(repo, function(commit)
    local started = M.run(M.plan({ python = python, nvidia = nvidia, repo = repo }), function(ok)
      if ok and commit then
        M.write_marker(commit, repo)
      end
      release()
      if done then
        done(ok)
      end
    end)
    if not started then
      release()
    end
  end)
  return true
end

return M
