-- Options: the defaults, and the ones in force (the defaults until setup() changes them).
local M = {}

M.defaults = {
  -- The server command. nil: `specdec` on $PATH, else the `.venv/bin/specdec` of the repository this
  -- plugin lives in (clients/neovim/../../.venv), else `specdec` (and :checkhealth says why it fails).
  -- `{ '/path/to/python', '-m', 'speccomplete', 'serve' }` works too.
  cmd = nil,
  -- Filetypes that start the server; nil: every file buffer with a filetype.
  filetypes = nil,
  -- initializationOptions, camelCase as in server/options.py: backend (local, llamacpp, openai), gguf,
  -- llamacppSpeculative, openaiUrl, openaiModel, openaiApiKeyEnv, target, draft, device, dtype,
  -- quantization, gamma, maxTokensSingleLine, maxTokensMultiLine, temperature, debounceMs, telemetry,
  -- telemetryPath, telemetryText, enabledLanguages. Unset keys take the server's defaults.
  init_options = {},
  -- How completions are shown:
  --   'auto'    'native' where Neovim has vim.lsp.inline_completion (0.12+), else 'extmark' on 0.9+,
  --             else 'popup';
  --   'native'  Neovim's own inline completion (0.12+), enabled for the buffers specdec attaches to;
  --   'extmark' this plugin's ghost text (inline virtual text on 0.10+, an overlay before);
  --   'popup'   the completion menu (textDocument/completion): omnifunc <C-x><C-o> before 0.11,
  --             vim.lsp.completion from 0.11.
  display = 'auto',
  -- 'extmark': ask as you type (false: only when next/prev is pressed).
  auto_trigger = true,
  -- 'extmark': nil asks at each key and the server waits for the pause, as long as your pace between keys
  -- needs; milliseconds of typing pause to wait in Neovim instead (the native path waits 200 ms).
  debounce_ms = nil,
  -- Insert-mode keys, buffer-local, set when specdec attaches (ghost text displays only). false
  -- disables one. With no ghost text shown, each key does what it did before (its previous mapping,
  -- or the key itself); next/prev ask for a completion then.
  keymaps = {
    accept = '<Tab>',
    accept_word = '<M-Right>',
    accept_line = '<M-C-Right>',
    next = '<M-]>',
    prev = '<M-[>',
    dismiss = '<C-]>',
  },
  -- 'popup' on 0.11+: open the menu as you type (false: only on <C-x><C-o>).
  autotrigger = true,
  -- Show the server's model loading in the command line and say "ready" once (false: only the
  -- statusline and :SpecdecStatus say it).
  progress = true,
}

M.options = vim.deepcopy(M.defaults)

-- Merge `opts` over the defaults and make them the options in force.
function M.set(opts)
  opts = opts or {}
  if opts.accept_key ~= nil then -- the option's name before keymaps.accept
    opts = vim.tbl_deep_extend('force', { keymaps = { accept = opts.accept_key } }, opts)
    opts.accept_key = nil
  end
  M.options = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts)
  return M.options
end

-- The display `options` (default: the ones set) come to: 'native', 'extmark' or 'popup', 'auto' resolved to
-- Neovim's own inline completion where it has one (0.12), else the plugin's ghost text (0.9+), else the popup.
function M.display(options)
  local display = (options or M.options).display
  if display ~= 'auto' then
    return display
  end
  if require('specdec.native').available() then
    return 'native'
  end
  -- Ghost text needs only extmarks; before 0.9 the popup stays the default (the tested fallback).
  if vim.fn.has('nvim-0.9') == 1 then
    return 'extmark'
  end
  return 'popup'
end

-- init_options as sent. One debounce, not two: a display that waits for the pause itself (native after
-- Neovim's own wait, popup on trigger characters, extmark given debounce_ms) tells the server not to wait
-- again (debounceMs = 0); extmark without debounce_ms asks at each key and leaves the wait to the server.
-- A debounceMs the user set is sent as set.
function M.init_options(options)
  options = options or M.options
  local init = vim.deepcopy(options.init_options or {})
  local server_waits = M.display(options) == 'extmark' and options.debounce_ms == nil
  if init.debounceMs == nil and not server_waits then
    init.debounceMs = 0
  end
  return init
end

return M
