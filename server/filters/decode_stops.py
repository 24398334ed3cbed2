"""Strings that end a completion while it decodes: a line end for single-line completions; for multi-line ones,
two blank lines or the start of a new top-level definition (at column 0, so nested ones do not match)."""

from __future__ import annotations

from speccomplete.server.filters.context import TrimContext

_C = ("\n#include", "\n#define", "\ntypedef ", "\nstruct ", "\nstatic ", "\nvoid ", "\nint ")
_JS = ("\nfunction ", "\nclass ", "\nexport ", "\nimport ")
TOP_LEVEL = {
    "python": ("\ndef ", "\nclass ", "\nasync def ", "\nif __name__", "\nimport ", "\nfrom "),
    "c": _C,
    "cpp": _C + ("\nclass ", "\nnamespace ", "\ntemplate", "\nusing "),
    "java": ("\npublic class ", "\nclass ", "\ninterface ", "\nimport ", "\npackage "),
    "go": ("\nfunc ", "\ntype ", "\nvar ", "\nconst ", "\nimport ", "\npackage "),
    "rust": ("\nfn ", "\npub fn ", "\nimpl ", "\nimpl<", "\nstruct ", "\npub struct ", "\nenum ", "\ntrait ",
             "\nmod ", "\nuse ", "\n#["),
    "javascript": _JS,
    "typescript": _JS + ("\ninterface ", "\ntype "),
    "tsx": _JS + ("\ninterface ", "\ntype "),
    "lua": ("\nfunction ", "\nlocal function "),
    "haskell": ("\nmodule ", "\nimport ", "\ndata ", "\ntype ", "\nnewtype ", "\nclass ", "\ninstance "),
    "ruby": ("\ndef ", "\nclass ", "\nmodule ", "\nrequire "),
    "zig": ("\nfn ", "\npub fn ", "\nconst ", "\npub const ", "\ntest "),
    "elixir": ("\ndefmodule ",),
    "ocaml": ("\nlet ", "\ntype ", "\nmodule ", "\nopen ", "\nexception ", "\n;;"),
    "bash": ("\nfunction ",),
}


def stop_strings(language: str, multiline: bool) -> tuple[str, ...]:
    if not multiline:
        return ("\n",)
    return ("\n\n\n",) + TOP_LEVEL.get(language, ())


def cut(completion: str, ctx: TrimContext) -> int | None:
    """The decoder stops at these already; this covers text that reached us some other way."""
    found = [i for s in stop_strings(ctx.language, ctx.multiline) if (i := completion.find(s)) >= 0]
    return min(found) if found else None
