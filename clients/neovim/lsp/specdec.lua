-- The specdec server for Neovim 0.11+'s vim.lsp.config / vim.lsp.enable:
--
--   vim.lsp.enable('specdec')
--   vim.lsp.config('specdec', { init_options = { maxTokensSingleLine = 24 } })   -- optional overrides
--
-- cmd: `specdec` on $PATH, else this repository's .venv/bin/specdec. No filetypes: every file buffer.
-- One server for the whole Neovim (reuse_client): it holds the models in memory.
-- plugin/specdec.lua adds the ghost text and keys to the buffers it attaches to.
local options = require('specdec.config').options
if require('specdec').check_server(options) then
  require('specdec.update').check(options) -- the venv :SpecdecInstall made, kept on the plugin's checkout
end
return require('specdec.server').config()
