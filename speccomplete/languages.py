"""Every language the server completes, one record each: what to call it, how to recognise it, how to parse it,
where a completion in it ends, and which resource group the reports put it in.

A language's name is our id for it everywhere: in events, in `enabledLanguages`, in `--languages` and the corpus
split lists (each is also its grammar's name, but parsing reads `tree_sitter`). A document we cannot place is "text"
(`TEXT`): it still gets completions, with indentation rules instead of syntax.

The regular expressions here are per-language approximations used by server/prompt.py (block openers, header
lines) and server/filters/brackets.py (comments and strings, whose brackets do not count).

This module imports nothing of this project, so every layer may read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Resource groups by how much public code each language has: the disparity report compares languages within one.
Group = Literal["high", "medium", "low"]


@dataclass(frozen=True)
class Language:
    name: str
    tree_sitter: str | None  # tree-sitter-language-pack grammar; None: no syntax tree
    language_ids: tuple[str, ...]  # LSP / VS Code languageIds, lower case
    extensions: tuple[str, ...]  # lower case, with the dot; ".h" is C's and C++'s both (server/language.py decides)
    stop_strings: tuple[str, ...]  # starts of a new top-level definition (column 0): they end a multi-line completion
    group: Group | None  # None: in no group of the disparity report
    interpreters: tuple[str, ...] = ()  # shebang programs; a version suffix also matches (python3.12)
    block_opener: str = r"[{:]"  # a line ending in this opens a block: the completion is multi-line
    header: str | None = None  # a file header line (imports, includes), matched after its indentation
    comments_and_strings: tuple[str, ...] = ()  # regexes, longest forms first
    # how a line is commented out: around each line of context from elsewhere (server/snippets.py)
    line_comment: tuple[str, str] = ("//", "")


_DQ, _SQ, _BACKTICK = r'"(?:\\.|[^"\\\n])*"?', r"'(?:\\.|[^'\\\n])*'?", r"`(?:\\.|[^`\\])*`?"
_TRIPLE_DQ, _TRIPLE_SQ = r'"""[\s\S]*?(?:"""|\Z)', r"'''[\s\S]*?(?:'''|\Z)"
_SLASH = r"/\*[\s\S]*?(?:\*/|\Z)", r"//[^\n]*"
_C_LIKE_OPENER = r"\{|(?<!:):"  # `{`, and `case x:` / `default:` / `public:`, but not `std::`
_C_STOPS = ("\n#include", "\n#define", "\ntypedef ", "\nstruct ", "\nstatic ", "\nvoid ", "\nint ")
_JS_STOPS = ("\nfunction ", "\nclass ", "\nexport ", "\nimport ")
_JS_HEADER = r"import\b|export\s.*\bfrom\b|(?:const|let|var)\s.*=\s*require\("

LANGUAGES: tuple[Language, ...] = (
    Language(
        "python",
        "python",
        ("python",),
        (".py", ".pyi"),
        ("\ndef ", "\nclass ", "\nasync def ", "\nif __name__", "\nimport ", "\nfrom "),
        "high",
        interpreters=("python",),
        block_opener=r":",
        header=r"(?:import|from)\s",
        comments_and_strings=(_TRIPLE_DQ, _TRIPLE_SQ, r"#[^\n]*", _DQ, _SQ),
        line_comment=("#", ""),
    ),
    Language(
        "cpp",
        "cpp",
        ("cpp", "c++"),
        (".cc", ".cpp", ".cxx", ".hpp", ".hh", ".hxx", ".h"),
        _C_STOPS + ("\nclass ", "\nnamespace ", "\ntemplate", "\nusing "),
        "high",
        block_opener=_C_LIKE_OPENER,
        header=r"#\s*include\b|using\s|import\s",
        comments_and_strings=(*_SLASH, _DQ, _SQ),
    ),
    Language(
        "java",
        "java",
        ("java",),
        (".java",),
        ("\npublic class ", "\nclass ", "\ninterface ", "\nimport ", "\npackage "),
        "high",
        block_opener=_C_LIKE_OPENER,
        header=r"(?:package|import)\s",
        comments_and_strings=(*_SLASH, _DQ, _SQ),
    ),
    Language(
        "c",
        "c",
        ("c",),
        (".c", ".h"),
        _C_STOPS,
        "high",
        block_opener=_C_LIKE_OPENER,
        header=r"#\s*include\b",
        comments_and_strings=(*_SLASH, _DQ, _SQ),
    ),
    Language(
        "javascript",
        "javascript",
        ("javascript", "javascriptreact"),
        (".js", ".mjs", ".cjs", ".jsx"),
        _JS_STOPS,
        "high",
        interpreters=("node",),
        block_opener=_C_LIKE_OPENER,
        header=_JS_HEADER,
        comments_and_strings=(*_SLASH, _DQ, _SQ, _BACKTICK),
    ),
    Language(
        "go",
        "go",
        ("go",),
        (".go",),
        ("\nfunc ", "\ntype ", "\nvar ", "\nconst ", "\nimport ", "\npackage "),
        "high",
        block_opener=_C_LIKE_OPENER,
        header=r"(?:package|import)\b",
        comments_and_strings=(*_SLASH, _DQ, _SQ, _BACKTICK),
    ),
    Language(
        "lua",
        "lua",
        ("lua",),
        (".lua",),
        ("\nfunction ", "\nlocal function "),
        "medium",
        interpreters=("lua",),
        block_opener=r"\b(?:then|do|else|repeat)|\bfunction\b.*\)|\{",
        header=r"(?:local\s+[\w,\s]+=\s*)?require\b",
        comments_and_strings=(r"--\[\[[\s\S]*?(?:\]\]|\Z)", r"--[^\n]*", r"\[\[[\s\S]*?(?:\]\]|\Z)", _DQ, _SQ),
        line_comment=("--", ""),
    ),
    Language(
        "haskell",
        "haskell",
        ("haskell",),
        (".hs",),
        ("\nmodule ", "\nimport ", "\ndata ", "\ntype ", "\nnewtype ", "\nclass ", "\ninstance "),
        "medium",
        interpreters=("runghc",),
        block_opener=r"=|->|\b(?:where|do|of|let|then|else|in)",
        header=r"(?:module|import)\s",
        comments_and_strings=(r"\{-[\s\S]*?(?:-\}|\Z)", r"--[^\n]*", _DQ),  # ' is also a prime: x'
        line_comment=("--", ""),
    ),
    Language(
        "ruby",
        "ruby",
        ("ruby",),
        (".rb", ".rake"),
        ("\ndef ", "\nclass ", "\nmodule ", "\nrequire "),
        "medium",
        interpreters=("ruby",),
        block_opener=r"\b(?:do|then|else|begin)(?:\s*\|[^|]*\|)?"
        r"|^\s*(?:def|class|module|if|unless|while|until|case|elsif|when)\b.*|\{\s*(?:\|[^|]*\|)?",
        header=r"(?:require|require_relative|load)\b",
        comments_and_strings=(r"#[^\n]*", _DQ, _SQ),
        line_comment=("#", ""),
    ),
    Language(
        "rust",
        "rust",
        ("rust",),
        (".rs",),
        (
            "\nfn ",
            "\npub fn ",
            "\nimpl ",
            "\nimpl<",
            "\nstruct ",
            "\npub struct ",
            "\nenum ",
            "\ntrait ",
            "\nmod ",
            "\nuse ",
            "\n#[",
        ),
        "medium",
        block_opener=r"\{",
        header=r"(?:pub(?:\([\w:]+\))?\s+)?(?:use\s|extern\s+crate\s|mod\s+\w+\s*;)",
        comments_and_strings=(*_SLASH, _DQ),  # ' is also a lifetime
    ),
    Language(
        "typescript",
        "typescript",
        ("typescript",),
        (".ts", ".mts", ".cts"),
        _JS_STOPS + ("\ninterface ", "\ntype "),
        "medium",
        block_opener=_C_LIKE_OPENER,
        header=_JS_HEADER,
        comments_and_strings=(*_SLASH, _DQ, _SQ, _BACKTICK),
    ),
    Language(
        "zig",
        "zig",
        ("zig",),
        (".zig",),
        ("\nfn ", "\npub fn ", "\nconst ", "\npub const ", "\ntest "),
        "low",
        block_opener=r"\{",
        header=r"(?:pub\s+)?const\s+\w+\s*=\s*@import\(",
        comments_and_strings=(r"//[^\n]*", _DQ, _SQ),
    ),
    Language(
        "elixir",
        "elixir",
        ("elixir",),
        (".ex", ".exs"),
        ("\ndefmodule ",),
        "low",
        interpreters=("elixir",),
        block_opener=r"\b(?:do|else|fn)|->",
        header=r"(?:import|alias|require|use)\s",  # matched after indentation: these live inside defmodule
        comments_and_strings=(_TRIPLE_DQ, r"#[^\n]*", _DQ, _SQ),
        line_comment=("#", ""),
    ),
    Language(
        "ocaml",
        "ocaml",
        ("ocaml",),
        (".ml", ".mli"),
        ("\nlet ", "\ntype ", "\nmodule ", "\nopen ", "\nexception ", "\n;;"),
        "low",
        interpreters=("ocaml",),
        block_opener=r"=|->|\b(?:then|else|do|in|begin|struct|sig|with|function)",
        header=r"(?:open|include)\s",
        comments_and_strings=(r"\(\*[\s\S]*?(?:\*\)|\Z)", _DQ),  # ' is also a type variable: 'a
        line_comment=("(*", " *)"),
    ),
    Language(
        "tsx",
        "tsx",
        ("typescriptreact", "tsx"),
        (".tsx",),
        _JS_STOPS + ("\ninterface ", "\ntype "),
        None,
        block_opener=_C_LIKE_OPENER,
        header=r"import\b|export\s.*\bfrom\b",
        comments_and_strings=(*_SLASH, _DQ, _SQ, _BACKTICK),
    ),
    Language(
        "bash",
        "bash",
        ("shellscript", "bash"),
        (".sh", ".bash"),
        ("\nfunction ",),
        None,
        interpreters=("bash", "sh"),
        block_opener=r"\b(?:then|do|else|in)|\{",
        header=r"(?:source|\.)\s",
        comments_and_strings=(r"(?:^|(?<=\s))#[^\n]*", _DQ, _SQ, _BACKTICK),  # not ${#x}
        line_comment=("#", ""),
    ),
)

TEXT = Language("text", None, (), (), (), None, comments_and_strings=(_DQ,), line_comment=("", ""))

_BY_NAME = {language.name: language for language in (*LANGUAGES, TEXT)}


def language_named(name: str) -> Language | None:
    """The record for one of our language names ("text" included), or None for a name we do not know."""
    return _BY_NAME.get(name)
