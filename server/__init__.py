"""The language server: documents, languages, prompts and completions over LSP."""
