-- :checkhealth specdec: the server executable and its Python package, the venv :SpecdecInstall makes,
-- the model cache, the Neovim version and the way completions are shown, and the state of a running
-- server.
local config = require('specdec.config')
local server = require('specdec.server')

local M = {}

-- vim.health's functions were report_* before 0.10, and in require('health') on 0.7.
local health = vim.health or require('health')
local function report(kind, msg, advice)
  local fn = health[kind] or health['report_' .. kind]
  if advice then
    fn(msg, advice)
  else
    fn(msg)
  end
end

local DEFAULT_TARGET = 'gemma3-270m' -- decoder/packaged.py's DEFAULT_TARGET

-- $SPECDEC_CACHE, else $XDG_CACHE_HOME/specdec, else ~/.cache/specdec (decoder/packaged.py's cache_root).
local function cache_root()
  if vim.env.SPECDEC_CACHE and vim.env.SPECDEC_CACHE ~= '' then
    return vim.env.SPECDEC_CACHE
  end
  local xdg = vim.env.XDG_CACHE_HOME
  return ((xdg and xdg ~= '') and xdg or vim.fn.expand('~/.cache')) .. '/specdec'
end

-- The Python that runs the server: the command's own (python -m speccomplete), else the executable's
-- shebang.
local function python_of(cmd)
  local exe = vim.fn.exepath(cmd[1])
  if exe == '' then
    return nil
  end
  if vim.fn.fnamemodify(exe, ':t'):match('^python') then
    return exe
  end
  local first = (vim.fn.readfile(exe, '', 1)[1] or '')
  local interpreter = first:match('^#!%s*(%S+)')
  if interpreter and interpreter:match('/env$') then
    interpreter = vim.fn.exepath(first:match('^#!%s*%S+%s+(%S+)') or '')
  end
  return interpreter ~= '' and interpreter or nil
end

-- The command and init_options in force: the running client's, else vim.lsp.config's (0.11+), else
-- the options'.
local function effective(options)
  local client = server.client()
  local conf = client and client.config
  if not conf and vim.lsp.config and vim.lsp.enable then
    conf = vim.lsp.config[server.NAME]
  end
  local cmd = conf and type(conf.cmd) == 'table' and conf.cmd or server.cmd(options)
  local init = conf and conf.init_options or options.init_options or {}
  return cmd, init
end

local function check_server(options)
  report('start', 'specdec: server')
  local cmd = effective(options)
  local exe = vim.fn.exepath(cmd[1])
  if exe == '' then
    report('error', string.format('%s is not executable', cmd[1]), {
      ':SpecdecInstall installs the server in a venv of its own (no terminal needed); or `bash .ci/setup`'
        .. ' in the repository makes .venv/bin/specdec; or put `specdec` on $PATH, or set `cmd` in setup().',
    })
    return
  end
  local found, how = server.find_executable()
  local where = (found and vim.fn.exepath(found) == exe) and ('found ' .. how) or 'configured'
  report('ok', string.format('command: %s (%s, %s)', table.concat(cmd, ' '), exe, where))
  local python = python_of(cmd)
  if not python then
    report('warn', 'cannot tell which Python runs ' .. exe)
    return
  end
  local out = vim.fn.system({
    python,
    '-c',
    table.concat({
      'import sys, importlib.metadata as m',
      'try: version = m.version("speccomplete")',
      'except m.PackageNotFoundError: version = "none"',
      'print(sys.version.split()[0], version)',
    }, '\n'),
  })
  local py, version = vim.trim(out):match('^(%S+) (%S+)$')
  if vim.v.shell_error ~= 0 or not py then
    report('error', string.format('%s does not run: %s', python, vim.trim(out)))
  elseif version == 'none' then
    report('error', string.format('Python %s (%s) has no speccomplete package', py, python))
  else
    report('ok', string.format('Python %s (%s), speccomplete %s', py, python, version))
  end
end

local function check_install()
  report('start', 'specdec: :SpecdecInstall')
  local install = require('specdec.install')
  local installed = install.executable()
  if installed then
    report('ok', string.format('set up: %s (its log: %s)', installed, install.log_path()))
    return
  end
  local python, version = install.find_python()
  if not python then
    report('info', 'not set up; :SpecdecInstall needs a Python 3.11 or later on $PATH, and none is there')
    return
  end
  report('info', string.format('not set up (%s); :SpecdecInstall makes it with Python %s (%s): PyTorch %s, then'
    .. ' speccomplete from %s', install.venv(), version, python, install.has_nvidia()
    and 'from PyPI (nvidia-smi found a GPU)' or 'CPU build', install.repo()))
end

local function check_model(options)
  report('start', 'specdec: model')
  local _, init = effective(options)
  local backend = init.backend or 'local'
  if backend == 'openai' then
    report('info', 'backend openai: ' .. tostring(init.openaiUrl or 'the server default URL'))
    return
  end
  if backend == 'llamacpp' and init.gguf then
    local ok = vim.fn.filereadable(vim.fn.expand(init.gguf)) == 1
    report(ok and 'ok' or 'error', 'gguf: ' .. init.gguf .. (ok and '' or ' is not readable'))
    return
  end
  local target = init.target or DEFAULT_TARGET
  if vim.fn.isdirectory(vim.fn.expand(target)) == 1 then
    report('ok', 'target: the local directory ' .. target)
  elseif target:find('/', 1, true) then
    report('info', 'target: ' .. target .. ' (a Hugging Face id: loaded from its cache or the hub)')
  else
    local dir = cache_root() .. '/models/' .. target
    if vim.fn.filereadable(dir .. '/config.json') == 1 then
      report('ok', string.format('target %s is cached: %s', target, dir))
    else
      report('warn', string.format('target %s is not cached in %s yet', target, dir), {
        'The first start converts the packaged GGUF there (seconds); later starts take a second.',
      })
    end
  end
end

local function check_neovim(options)
  report('start', 'specdec: Neovim')
  local v = vim.version()
  local display = require('specdec').display(options)
  local how = {
    native = "ghost text: Neovim's vim.lsp.inline_completion",
    extmark = 'ghost text: extmarks, '
      .. (require('specdec.ghost').has_inline() and 'inline virtual text' or 'overlay (no inline virtual text before 0.10)'),
    popup = 'popup menu: ' .. ((vim.lsp.completion and vim.lsp.completion.enable) and 'vim.lsp.completion'
      or 'omnifunc, <C-x><C-o>'),
  }
  report('ok', string.format('Neovim %d.%d.%d; display %s (option %q): %s', v.major, v.minor, v.patch, display,
    options.display, how[display] or '?'))
  if display == 'native' and not require('specdec.native').available() then
    report('error', "display 'native' needs vim.lsp.inline_completion (Neovim 0.12+)")
  end
  if vim.lsp.config and vim.lsp.enable then
    report('info', "vim.lsp.config: the 'specdec' config is "
      .. (vim.api.nvim_get_runtime_file('lsp/specdec.lua', false)[1] or 'not on the runtimepath'))
  end
end

local function check_running()
  report('start', 'specdec: running server')
  local client = server.client()
  if not client then
    report('info', 'no specdec client is running (it starts with the first buffer it wants)')
    return
  end
  local status = require('specdec').status
  local kind = status.state == 'ready' and 'ok' or status.state == 'error' and 'error' or 'info'
  report(kind, string.format('client %d: %s%s', client.id, require('specdec').statusline(),
    (status.message and status.message ~= '') and (' - ' .. status.message) or ''))
  if require('specdec').display() == 'popup' then
    return
  end
  -- the keys are buffer-local: a completion plugin mapping the same key after specdec shadows it
  for bufnr in pairs(client.attached_buffers) do
    for name, lhs in pairs(config.options.keymaps or {}) do
      local map = lhs and vim.api.nvim_buf_call(bufnr, function()
        return vim.fn.maparg(lhs, 'i', false, true)
      end)
      if map and not (map.desc and map.desc:find('^specdec: ')) then
        report('warn', string.format('%s (%s) in %s is mapped by something else', lhs, name,
          vim.fn.fnamemodify(vim.api.nvim_buf_get_name(bufnr), ':~:.')))
      end
    end
  end
end

function M.check()
  local options = config.options
  check_neovim(options)
  check_server(options)
  check_install()
  check_model(options)
  check_running()
end

return M
