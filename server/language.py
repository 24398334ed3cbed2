"""Which language a document is in: LSP languageId first, then the file extension, then the shebang.

Names are tree-sitter-language-pack grammar names. A file we cannot place is "text": it still
gets completions, with indentation rules instead of syntax.
"""

from __future__ import annotations

import os

UNKNOWN = "text"

# LSP languageId -> grammar, where the two differ
LANGUAGE_IDS = {"c++": "cpp", "javascriptreact": "javascript", "typescriptreact": "tsx", "shellscript": "bash"}

EXTENSIONS = {
    ".py": "python", ".pyi": "python", ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp",
    ".hpp": "cpp", ".hh": "cpp", ".hxx": "cpp", ".java": "java", ".go": "go", ".rs": "rust",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "tsx", ".lua": "lua",
    ".hs": "haskell", ".rb": "ruby", ".rake": "ruby", ".zig": "zig", ".ex": "elixir", ".exs": "elixir",
    ".ml": "ocaml", ".mli": "ocaml", ".sh": "bash", ".bash": "bash",
}

SHEBANGS = {"python": "python", "python3": "python", "node": "javascript", "ruby": "ruby", "lua": "lua",
            "bash": "bash", "sh": "bash", "runghc": "haskell", "elixir": "elixir", "ocaml": "ocaml"}

KNOWN = set(EXTENSIONS.values())


def detect_language(path: str = "", language_id: str | None = None, text: str = "") -> str:
    if language_id:
        name = LANGUAGE_IDS.get(language_id.lower(), language_id.lower())
        if name in KNOWN:
            return name
    ext = os.path.splitext(path)[1].lower()
    if ext in EXTENSIONS:
        return EXTENSIONS[ext]
    if text.startswith("#!"):
        words = text[2 : text.find("\n") if "\n" in text else None].split()
        if words:
            program = os.path.basename(words[1] if os.path.basename(words[0]) == "env" and len(words) > 1 else words[0])
            for prefix, name in SHEBANGS.items():
                if program == prefix or program.startswith(prefix) and program[len(prefix):].replace(".", "").isdigit():
                    return name
    return UNKNOWN
