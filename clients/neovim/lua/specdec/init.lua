-- Neovim client for the specdec language server (`specdec serve` over stdio).
--
--   require('specdec').setup()            -- or, on 0.11+, vim.lsp.enable('specdec') (lsp/specdec.lua)
--
-- How completions are shown (the `display` option, config.lua):
--   native   0.12+: vim.lsp.inline_completion, enabled for specdec's buffers   (native.lua)
--   extmark  0.9+: ghost text drawn here, asked for as you type               (trigger.lua, ghost.lua)
--   popup    0.7/0.8: the completion menu, <C-x><C-o>                         (popup.lua)
-- Keys are buffer-local, set when the server attaches (keymaps.lua); :checkhealth specdec (health.lua).
local config = require('specdec.config')
local server = require('specdec.server')

local M = {}

-- The latest `specdec/status` notification: { state, message, acceptance, p50_ms }.
M.status = { state = 'loading', message = '', acceptance = nil, p50_ms = nil }

local said_ready = false

function M._on_status(params)
  M.status = params
  local message = type(params.message) == 'string' and params.message or ''
  vim.schedule(function()
    if params.state == 'error' then
      vim.notify('specdec: ' .. (message ~= '' and message or 'error'), vim.log.levels.ERROR)
    elseif params.state == 'loading' and config.options.progress then
      -- the load's progress in the command line, not kept in :messages ("converting ...: weights (40%)")
      vim.api.nvim_echo({ { 'specdec: ' .. message } }, false, {})
    elseif params.state == 'ready' and not said_ready and config.options.progress then
      said_ready = true
      vim.notify('specdec: ready (' .. message .. ')', vim.log.levels.INFO)
    end
  end)
  vim.schedule(function()
    vim.api.nvim_exec_autocmds('User', { pattern = 'SpecdecStatus', modeline = false })
    vim.cmd('redrawstatus!') -- a statusline showing M.statusline() follows without waiting for a redraw
  end)
end

-- The latest `specdec/completed` notification by document URI, with when it came (uv.now()): the
-- server sends it just before its answer, with `reason` saying why an empty answer is empty.
M.completed = {}

function M._on_completed(params)
  if type(params) == 'table' and params.uri then
    M.completed[params.uri] = { params = params, at = (vim.uv or vim.loop).now() }
    require('specdec.wait').answered(params.uri, params.outcome)
  end
end

-- The server's reasons for an empty answer (server/lsp.py's `reason`), in words; and the client's own.
M.REASONS = {
  gate = 'not confident enough',
  ['finished-line'] = 'end of a finished line',
  scope = 'the enclosing scope ends here',
  ['no-text'] = 'the model wrote nothing',
  cancelled = 'cancelled',
  stale = 'the text changed meanwhile',
  ['language-off'] = 'this language is off (enabledLanguages)',
  ['too-large'] = 'the file is too large',
  binary = 'the file is binary',
  error = 'the completion failed; :SpecdecStatus and the LSP log say why',
  loading = 'the server is still loading its models',
  missing = 'no specdec server found; :SpecdecInstall sets one up',
  undrawable = 'its answer replaces text this display cannot show',
}

function M.reason_words(reason)
  if type(reason) ~= 'string' then
    return 'no reason given'
  end
  local filter = reason:match('^filter:(.+)$')
  if filter then
    return 'trimmed away by the ' .. filter .. ' filter'
  end
  return M.REASONS[reason] or reason
end

-- On an asked-for completion that came back empty: say why in the message area, with the reason of
-- the server's latest `specdec/completed` for the buffer since `since` (uv.now() when it was asked).
-- `reason` overrides it (the client's own, e.g. 'undrawable'). Returns the message.
function M.explain_empty(bufnr, reason, since)
  local note = M.completed[vim.uri_from_bufnr(bufnr)]
  if not reason and note and note.at >= (since or 0) and note.params.outcome ~= 'shown' then
    reason = note.params.reason
  end
  if not reason and M.status.state ~= 'ready' then
    reason = M.status.state == 'missing' and 'missing' or 'loading'
  end
  local message = 'specdec: nothing to offer (' .. M.reason_words(reason) .. ')'
  vim.api.nvim_echo({ { message, 'WarningMsg' } }, true, {})
  return message
end

-- A short line for the statusline: "specdec ready 62% 180ms": the share accepted, and the p50 wait from
-- the last keystroke to ghost text measured here (wait.lua; the server's own p50 until there is one).
function M.statusline()
  local s = M.status
  local parts = { server.NAME, s.state }
  if s.state == 'ready' and s.optimizing == true then
    table.insert(parts, 'optimizing')
  end
  if s.acceptance ~= nil and s.acceptance ~= vim.NIL then
    table.insert(parts, string.format('%d%%', math.floor(s.acceptance * 100 + 0.5)))
  end
  local p50 = require('specdec.wait').p50()
  if p50 == nil and s.p50_ms ~= nil and s.p50_ms ~= vim.NIL then
    p50 = s.p50_ms
  end
  if p50 ~= nil then
    table.insert(parts, string.format('%dms', math.floor(p50 + 0.5)))
  end
  return table.concat(parts, ' ')
end

-- The display in use: 'native', 'extmark' or 'popup' (the `display` option, 'auto' resolved: config.display).
function M.display(options)
  return config.display(options)
end

-- The running specdec client (of `bufnr`, if given), or nil.
function M.client(bufnr)
  return server.client(bufnr)
end

-- The actions behind the keys, per display; each returns whether it did something.
local function actions(display)
  -- native.lua and trigger.lua answer the same calls: Neovim's own inline completion, or our ghost text
  local shown = display == 'native' and require('specdec.native') or require('specdec.trigger')
  return {
    accept = function(bufnr)
      return shown.accept(bufnr, 'all')
    end,
    accept_word = function(bufnr)
      return shown.accept(bufnr, 'word')
    end,
    accept_line = function(bufnr)
      return shown.accept(bufnr, 'line')
    end,
    next = function(bufnr)
      return shown.cycle(bufnr, 1)
    end,
    prev = function(bufnr)
      return shown.cycle(bufnr, -1)
    end,
    dismiss = shown.dismiss,
  }
end

-- Wire a buffer the specdec client attached to: its display and keys.
function M.attach(client, bufnr)
  if not client or client.name ~= server.NAME or not vim.api.nvim_buf_is_valid(bufnr) then
    return
  end
  local options = config.options
  local display = M.display(options)
  if display == 'popup' then
    require('specdec.popup').attach(client, bufnr, options)
    return
  end
  require('specdec.ghost').define_highlights()
  require('specdec.wait').attach(bufnr)
  if display == 'native' then
    require('specdec.native').attach(client, bufnr)
  else
    require('specdec.trigger').attach(client, bufnr)
  end
  require('specdec.keymaps').set(bufnr, options.keymaps, actions(display))
end

-- LspAttach (0.8+) wires each buffer specdec attaches to, however the client was started (setup(),
-- vim.lsp.enable('specdec')); 0.7 has no such event and uses start_client's on_attach instead.
function M.hook()
  if vim.fn.exists('##LspAttach') == 0 then
    return false
  end
  local group = vim.api.nvim_create_augroup('specdec', { clear = true })
  vim.api.nvim_create_autocmd('LspAttach', {
    group = group,
    callback = function(args)
      M.attach(vim.lsp.get_client_by_id(args.data.client_id), args.buf)
    end,
  })
  vim.api.nvim_create_autocmd('ColorScheme', {
    group = group,
    callback = function()
      require('specdec.ghost').define_highlights()
    end,
  })
  return true
end

function M.commands()
  vim.api.nvim_create_user_command('SpecdecStatus', function()
    print(M.statusline() .. (M.status.message ~= '' and (' - ' .. M.status.message) or ''))
  end, { desc = 'specdec: server state, acceptance and p50 keystroke to ghost text' })
  vim.api.nvim_create_user_command('SpecdecInstall', function()
    require('specdec.install').install()
  end, { desc = "specdec: install the server in a venv of its own (stdpath('data')/specdec/venv)" })
end

-- Set the options (config.lua) and start the server for the buffers it wants.
function M.setup(opts)
  local options = config.set(opts)
  local hooked = M.hook()
  M.commands()
  server.start(options, not hooked and M.attach or nil)
  if M.check_server(options) then
    -- the venv :SpecdecInstall made, installed again in the background if the plugin's checkout moved on
    require('specdec.update').check(options, not hooked and M.attach or nil)
  end
end

-- After :SpecdecInstall: start the server it installed, for the buffers open now and later, as setup() would
-- have (on 0.11+ Neovim's own vim.lsp.enable, whose config now finds it). A `cmd` option names another server:
-- that one is left to a restart. Returns whether it started one.
function M.start_installed()
  local options = config.options
  if options.cmd or not server.find_executable() then
    return false
  end
  M.status = { state = 'loading', message = 'starting the installed server' }
  server.start(options, vim.fn.exists('##LspAttach') == 0 and M.attach or nil)
  return true
end

-- With no `cmd` option and no specdec found, say so once and show it in the statusline: Neovim would
-- otherwise start nothing without a word.
function M.check_server(options)
  if options.cmd or server.find_executable() then
    return true
  end
  if M.status.state == 'missing' then
    return false -- said already
  end
  M.status = { state = 'missing', message = 'no specdec server found; :SpecdecInstall sets one up' }
  vim.schedule(function()
    vim.notify('specdec: ' .. M.status.message .. ' (or put specdec on $PATH)', vim.log.levels.WARN)
  end)
  return false
end

return M
