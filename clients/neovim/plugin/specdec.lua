-- Loaded at startup from the runtimepath. Starts nothing: the server starts with
-- require('specdec').setup() or, on 0.11+, vim.lsp.enable('specdec') (lsp/specdec.lua). This wires
-- the buffers it attaches to (ghost text, keys) and defines :SpecdecStatus and :SpecdecInstall, so that
-- vim.lsp.enable('specdec') alone is enough.
if vim.g.loaded_specdec then
  return
end
vim.g.loaded_specdec = true

local specdec = require('specdec')
specdec.hook()
specdec.commands()
