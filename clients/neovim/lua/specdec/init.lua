-- Neovim client for the specdec language server (`specdec serve` over stdio).
--
--   require('specdec').setup({ cmd = { '/path/to/.venv/bin/specdec', 'serve' } })
--
-- Neovim >= 0.12: built-in inline completion (ghost text), accepted with `accept_key`.
-- Neovim 0.11:    vim.lsp.config / vim.lsp.enable and vim.lsp.completion (the popup menu,
--                 autotriggered), using the server's textDocument/completion fallback.
-- Neovim < 0.11:  vim.lsp.start_client, completion through the omnifunc (<C-x><C-o>).
-- In every case an accepted item runs its `command` (specdec.accept), so the server's
-- telemetry records the completion as accepted.
local M = {}

M.defaults = {
  -- The server command; `{ '/path/to/python', '-m', 'speccomplete', 'serve' }` works too.
  cmd = { 'specdec', 'serve' },
  -- Filetypes that start the server; nil: every buffer with a filetype.
  filetypes = nil,
  -- initializationOptions, camelCase as in server/options.py: backend (local, llamacpp, openai),
  -- gguf, llamacppSpeculative, openaiUrl, openaiModel, openaiApiKeyEnv, target, draft, device, dtype, quantization,
  -- gamma, maxTokensSingleLine, maxTokensMultiLine, temperature, debounceMs, telemetry,
  -- telemetryPath, telemetryText, enabledLanguages. Unset keys take the server's defaults.
  init_options = {},
  -- Insert-mode key that accepts the ghost text (0.12+); it types itself when none is shown.
  accept_key = '<Tab>',
  -- 0.11: open the completion menu as you type (false: only on <C-x><C-o>).
  autotrigger = true,
}

-- The latest `specdec/status` notification: { state, message, acceptance, p50_ms }.
M.status = { state = 'loading', message = '', acceptance = nil, p50_ms = nil }

local NAME = 'specdec'

local function on_status(_, params)
  M.status = params
  if params.state == 'error' then
    vim.schedule(function()
      vim.notify('specdec: ' .. (params.message or 'error'), vim.log.levels.ERROR)
    end)
  end
  vim.schedule(function()
    vim.api.nvim_exec_autocmds('User', { pattern = 'SpecdecStatus', modeline = false })
  end)
end

-- A short line for the statusline: "specdec ready 62% 180ms".
function M.statusline()
  local s = M.status
  local parts = { NAME, s.state }
  if s.acceptance ~= nil and s.acceptance ~= vim.NIL then
    table.insert(parts, string.format('%d%%', math.floor(s.acceptance * 100 + 0.5)))
  end
  if s.p50_ms ~= nil and s.p50_ms ~= vim.NIL then
    table.insert(parts, string.format('%dms', math.floor(s.p50_ms + 0.5)))
  end
  return table.concat(parts, ' ')
end

local function root_dir(bufnr)
  local name = vim.api.nvim_buf_get_name(bufnr)
  local dir = name ~= '' and vim.fn.fnamemodify(name, ':p:h') or vim.fn.getcwd()
  local git = vim.fn.finddir('.git', dir .. ';')
  return git ~= '' and vim.fn.fnamemodify(git, ':p:h:h') or dir
end

local function wants(opts, bufnr)
  local ft = vim.bo[bufnr].filetype
  if ft == '' or vim.bo[bufnr].buftype ~= '' then
    return false
  end
  return opts.filetypes == nil or vim.tbl_contains(opts.filetypes, ft)
end

-- The specdec client started by setup_start_client, or nil.
local client_id = nil

local ACCEPT = 'specdec.accept'

local function specdec_item(completed)
  local data = type(completed) == 'table' and completed.user_data
  local item = type(data) == 'table' and data.nvim and data.nvim.lsp and data.nvim.lsp.completion_item
  if item and item.command and item.command.command == ACCEPT then
    return item
  end
end

-- The popup menu inserts an item's `word`: all of it on < 0.11 (where each newline becomes a
-- space), its first line on 0.11 (see `convert`). Replace that with the item's exact text.
local function insert_full_text(completed, item)
  local text = (item.textEdit and item.textEdit.newText) or item.insertText or item.label
  local word = completed.word
  if text == word and not text:find('\n', 1, true) then
    return
  end
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  local start = col - #word
  if start < 0 then
    return
  end
  local lines = vim.split(text, '\n', { plain = true })
  vim.api.nvim_buf_set_text(0, row - 1, start, row - 1, col, lines)
  local last_col = (#lines == 1 and start or 0) + #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { row + #lines - 1, last_col })
end

-- An item accepted from the menu: insert its whole text, and (< 0.11, where Neovim does not)
-- run its command so the server records the acceptance.
local function on_complete_done(run_command)
  local completed = vim.v.completed_item
  local item = specdec_item(completed)
  if not item then
    return
  end
  insert_full_text(completed, item)
  local client = run_command and client_id and vim.lsp.get_client_by_id(client_id)
  if client then
    client.request('workspace/executeCommand', {
      command = item.command.command,
      arguments = item.command.arguments,
    }, function() end, vim.api.nvim_get_current_buf())
  end
end

-- Neovim >= 0.11: the server is described once and started per root by vim.lsp.enable.
local function setup_lsp_config(opts)
  vim.lsp.config(NAME, {
    cmd = opts.cmd,
    filetypes = opts.filetypes,
    root_dir = function(bufnr, on_dir)
      if wants(opts, bufnr) then
        on_dir(root_dir(bufnr))
      end
    end,
    init_options = opts.init_options,
    handlers = { ['specdec/status'] = on_status },
  })
  vim.lsp.enable(NAME)

  if vim.lsp.inline_completion then
    vim.lsp.inline_completion.enable(true)
    if opts.accept_key then
      vim.keymap.set('i', opts.accept_key, function()
        if not vim.lsp.inline_completion.get() then
          return opts.accept_key
        end
      end, { expr = true, replace_keycodes = true, desc = 'specdec: accept the inline completion' })
    end
    return
  end

  -- 0.11: the popup menu. vim.lsp.completion runs the item's command on accept; its `word`
  -- would be the text up to the first space, so show the first line, then insert it all.
  local group = vim.api.nvim_create_augroup('specdec', { clear = true })
  vim.api.nvim_create_autocmd('LspAttach', {
    group = group,
    callback = function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if client and client.name == NAME then
        vim.lsp.completion.enable(true, client.id, args.buf, {
          autotrigger = opts.autotrigger,
          convert = function(item)
            local text = (item.textEdit and item.textEdit.newText) or item.insertText or item.label
            return { word = vim.split(text, '\n', { plain = true })[1] }
          end,
        })
      end
    end,
  })
  vim.api.nvim_create_autocmd('CompleteDone', {
    group = group,
    callback = function()
      on_complete_done(false)
    end,
  })
end

-- Neovim < 0.11 (0.7+): one client for the session, attached to each wanted buffer.
local function setup_start_client(opts)
  local group = vim.api.nvim_create_augroup('specdec', { clear = true })
  vim.api.nvim_create_autocmd('FileType', {
    group = group,
    callback = function(args)
      local bufnr = args.buf
      if not wants(opts, bufnr) then
        return
      end
      if not client_id or not vim.lsp.get_client_by_id(client_id) then
        client_id = vim.lsp.start_client({
          name = NAME,
          cmd = opts.cmd,
          root_dir = root_dir(bufnr),
          init_options = opts.init_options,
          handlers = { ['specdec/status'] = on_status },
        })
      end
      if client_id then
        vim.lsp.buf_attach_client(bufnr, client_id)
        vim.bo[bufnr].omnifunc = 'v:lua.vim.lsp.omnifunc'
      end
    end,
  })
  vim.api.nvim_create_autocmd('CompleteDone', {
    group = group,
    callback = function()
      on_complete_done(true)
    end,
  })
end

-- The running specdec client, or nil (for scripts and tests).
function M.client()
  if vim.lsp.get_clients then
    return vim.lsp.get_clients({ name = NAME })[1]
  end
  return client_id and vim.lsp.get_client_by_id(client_id) or nil
end

function M.setup(opts)
  opts = vim.tbl_deep_extend('force', M.defaults, opts or {})
  if next(opts.init_options) == nil then
    opts.init_options = vim.empty_dict() -- sent as {}, not [], which the server would reject
  end
  if vim.lsp.config and vim.lsp.enable then
    setup_lsp_config(opts)
  else
    setup_start_client(opts)
  end
  vim.api.nvim_create_user_command('SpecdecStatus', function()
    print(M.statusline() .. (M.status.message ~= '' and (' - ' .. M.status.message) or ''))
  end, { desc = 'specdec: server state, acceptance and p50 latency' })
end

return M
