-- Finding and starting the server, and the few client calls whose form changed across Neovim versions.
local config = require('specdec.config')

local M = {}

M.NAME = 'specdec'
M.ACCEPT = 'specdec.accept' -- the command an item carries; running it records the acceptance

-- clients/neovim, from this file's path (lua/specdec/server.lua), symlinks resolved (a pack/ link).
function M.plugin_dir()
  local source = debug.getinfo(1, 'S').source:gsub('^@', '')
  return vim.fn.fnamemodify(vim.fn.resolve(vim.fn.fnamemodify(source, ':p')), ':h:h:h')
end

-- The `specdec` executable: the venv :SpecdecInstall makes (install.lua) first, then $PATH, then the
-- .venv of the repository holding this plugin. Returns its path and where it was found, or nil.
function M.find_executable()
  local installed = require('specdec.install').executable()
  if installed then
    return installed, 'in the venv :SpecdecInstall made'
  end
  local on_path = vim.fn.exepath('specdec')
  if on_path ~= '' then
    return on_path, 'on $PATH'
  end
  local repo = vim.fn.fnamemodify(M.plugin_dir(), ':h:h')
  for _, rel in ipairs({ '/.venv/bin/specdec', '/.venv/Scripts/specdec.exe' }) do
    if vim.fn.executable(repo .. rel) == 1 then
      return repo .. rel, "in the repository's .venv"
    end
  end
  return nil
end

-- The command that starts the server: the `cmd` option, else the executable found, else plain `specdec`.
function M.cmd(options)
  local cmd = (options or config.options).cmd
  if cmd then
    return cmd
  end
  return { M.find_executable() or 'specdec', 'serve' }
end

local function on_status(_, params)
  require('specdec')._on_status(params)
end

local function on_completed(_, params)
  require('specdec')._on_completed(params)
end

M.handlers = { ['specdec/status'] = on_status, ['specdec/completed'] = on_completed }

-- The vim.lsp.config (0.11+) entry, as lsp/specdec.lua returns it.
function M.config(options)
  options = options or config.options
  return {
    cmd = M.cmd(options),
    filetypes = options.filetypes,
    root_markers = { '.git' },
    init_options = config.init_options(options),
    handlers = M.handlers,
    -- One server per Neovim, whatever the project: each one holds the models in memory.
    reuse_client = function(client, conf)
      return client.name == conf.name
    end,
  }
end

-- The project root of a buffer (its .git's parent), else the file's folder: pre-0.11 start_client.
local function root_dir(bufnr)
  local name = vim.api.nvim_buf_get_name(bufnr)
  local dir = name ~= '' and vim.fn.fnamemodify(name, ':p:h') or vim.fn.getcwd()
  local git = vim.fn.finddir('.git', dir .. ';')
  return git ~= '' and vim.fn.fnamemodify(git, ':p:h:h') or dir
end

local function wants(options, bufnr)
  local ft = vim.bo[bufnr].filetype
  if ft == '' or vim.bo[bufnr].buftype ~= '' then
    return false
  end
  return options.filetypes == nil or vim.tbl_contains(options.filetypes, ft)
end

local client_id = nil -- the pre-0.11 client

-- Start the server for the buffers it wants. `on_attach(client, bufnr)` is for Neovims without the
-- LspAttach event (0.7); newer ones attach through the autocmd that init.lua sets.
function M.start(options, on_attach)
  if vim.lsp.config and vim.lsp.enable then -- 0.11+: described once, started per buffer by Neovim
    vim.lsp.config(M.NAME, M.config(options))
    vim.lsp.enable(M.NAME)
    return
  end
  local group = vim.api.nvim_create_augroup('specdec.start', { clear = true })
  local function attach(bufnr)
    if not wants(options, bufnr) then
      return
    end
    if not client_id or not vim.lsp.get_client_by_id(client_id) then
      client_id = vim.lsp.start_client({
        name = M.NAME,
        cmd = M.cmd(options),
        root_dir = root_dir(bufnr),
        init_options = config.init_options(options),
        handlers = M.handlers,
        on_attach = on_attach,
      })
    end
    if client_id then
      vim.lsp.buf_attach_client(bufnr, client_id)
    end
  end
  vim.api.nvim_create_autocmd('FileType', {
    group = group,
    callback = function(args)
      attach(args.buf)
    end,
  })
  -- Buffers already open when setup() runs (a plugin manager loading it late).
  for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(bufnr) then
      attach(bufnr)
    end
  end
end

-- The running specdec client, or nil.
function M.client(bufnr)
  if vim.lsp.get_clients then
    return vim.lsp.get_clients({ name = M.NAME, bufnr = bufnr })[1]
  end
  for _, client in pairs(vim.lsp.get_active_clients()) do
    if client.name == M.NAME and (bufnr == nil or vim.lsp.buf_is_attached(bufnr, client.id)) then
      return client
    end
  end
end

-- 0.11 made the client's functions methods (client:request); before, they were closures (client.request).
local methods = vim.fn.has('nvim-0.11') == 1

function M.request(client, method, params, handler, bufnr)
  if methods then
    return client:request(method, params, handler, bufnr)
  end
  return client.request(method, params, handler, bufnr)
end

function M.cancel(client, id)
  if methods then
    return client:cancel_request(id)
  end
  return client.cancel_request(id)
end

-- Run an item's command on the server (specdec.accept records the completion as accepted).
function M.run_command(client, command, bufnr)
  if command then
    M.request(client, 'workspace/executeCommand', {
      command = command.command,
      arguments = command.arguments,
    }, function() end, bufnr)
  end
end

-- The requests the client is waiting on answers for (client.requests: cancelled ones are left out, their
-- answers are dropped).
function M.pending(client)
  local n = 0
  for _, request in pairs(client.requests or {}) do
    if request.type == 'pending' then
      n = n + 1
    end
  end
  return n
end

-- Stop the running client, and once it has exited start the server again for the buffers open (a start
-- before then would reuse the stopping client): on 0.11+ vim.lsp.enable again, which attaches the buffers
-- its config wants (the user's vim.lsp.config overrides stay); before, start() as setup() ran it.
-- `done(started)` after.
function M.restart(options, on_attach, done)
  local old = M.client()
  if not old then
    return done and done(false)
  end
  local function stop(force)
    if methods then
      old:stop(force)
    else
      old.stop(force)
    end
  end
  stop(false) -- shutdown, then exit
  local waited = 0
  local function start_when_gone()
    if vim.lsp.get_client_by_id(old.id) and waited < 10000 then
      waited = waited + 50
      if waited == 3000 then
        stop(true) -- no answer to shutdown: ended
      end
      return vim.defer_fn(start_when_gone, 50)
    end
    if vim.lsp.config and vim.lsp.enable then
      vim.lsp.enable(M.NAME)
    else
      M.start(options, on_attach)
    end
    if done then
      done(true)
    end
  end
  start_when_gone()
end

return M
