-- :SpecdecInstall, the server without a terminal: a virtual environment of specdec's own in
-- stdpath('data')/specdec/venv, made with a Python 3.11+ found on the system (a venv, so PEP 668's
-- "externally managed" system Pythons are left alone), PyTorch's CPU build from PyTorch's index unless
-- nvidia-smi runs (PyPI's torch is the CUDA build, gigabytes a CPU has no use for), then speccomplete
-- from the repository this plugin lives in. server.lua's finder prefers this venv's specdec.
local M = {}

M.TORCH = 'torch==2.13.0'
M.CPU_INDEX = 'https://download.pytorch.org/whl/cpu'
M.PYTHONS = { 'python3.13', 'python3.12', 'python3.11', 'python3', 'python' }

-- stdpath('data')/specdec: the venv and the install log.
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

-- The steps, as { title, cmd } in order. opts: python (required), nvidia, venv, repo.
function M.plan(opts)
  local venv = opts.venv or M.venv()
  local python = venv .. (vim.fn.has('win32') == 1 and '/Scripts/python.exe' or '/bin/python')
  -- --no-compile: pip would byte-compile every module of torch and transformers (tens of seconds on a small
  -- CPU); Python compiles the ones the server imports on first use instead.
  local pip = { python, '-m', 'pip', 'install', '--disable-pip-version-check', '--no-compile' }
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
    title = 'installing speccomplete from ' .. (opts.repo or M.repo()),
    cmd = vim.list_extend(vim.deepcopy(pip), { opts.repo or M.repo() }),
  })
  return steps
end

local function notify(msg, level)
  vim.schedule(function()
    vim.notify('specdec: ' .. msg, level or vim.log.levels.INFO)
  end)
end

local running = false

-- Run the plan, one step after another, with a message as each starts; `done(ok)` at the end.
function M.run(steps, done)
  if running then
    notify('an install is already running', vim.log.levels.WARN)
    return false
  end
  running = true
  vim.fn.mkdir(M.dir(), 'p')
  local log = io.open(M.log_path(), 'w')
  local function finish(ok)
    running = false
    if log then
      log:close()
    end
    if done then
      vim.schedule(function()
        done(ok)
      end)
    end
  end
  local function step(i)
    local s = steps[i]
    if not s then
      vim.schedule(function()
        local started = require('specdec').start_installed()
        notify(string.format('installed %s; %s', M.executable() or M.venv(),
          started and 'starting it' or 'restart Neovim to start it'))
        finish(true)
      end)
      return
    end
    notify(string.format('[%d/%d] %s ...', i, #steps, s.title))
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
    local ok, job = pcall(vim.fn.jobstart, s.cmd, {
      on_stdout = collect,
      on_stderr = collect,
      on_exit = function(_, code)
        if code == 0 then
          return step(i + 1)
        end
        notify(string.format('%s failed (exit %d); the log is %s\n%s', s.title, code, M.log_path(),
          table.concat(tail, '\n')), vim.log.levels.ERROR)
        finish(false)
      end,
    })
    if not ok or job <= 0 then
      notify(s.title .. ': cannot run ' .. s.cmd[1], vim.log.levels.ERROR)
      finish(false)
    end
  end
  step(1)
  return true
end

-- :SpecdecInstall
function M.install(done)
  local python, version = M.find_python()
  if not python then
    notify('no Python 3.11 or later on $PATH (tried ' .. table.concat(M.PYTHONS, ', ') .. ')', vim.log.levels.ERROR)
    return false
  end
  local nvidia = M.has_nvidia()
  notify(string.format('installing into %s with Python %s (%s); PyTorch %s', M.venv(), version, python,
    nvidia and 'from PyPI (nvidia-smi found a GPU)' or 'CPU build'))
  return M.run(M.plan({ python = python, nvidia = nvidia }), done)
end

return M
