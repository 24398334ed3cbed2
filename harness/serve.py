"""`specdec serve`: the language server, as editors start it."""

from __future__ import annotations

import argparse
import gc
import logging
import sys

log = logging.getLogger(__name__)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve")
    p.add_argument("--tcp", action="store_true", help="listen on 127.0.0.1 instead of stdio")
    p.add_argument("--port", type=int, default=2087)
    # Also after `serve`, where an editor's server arguments put it; SUPPRESS keeps `specdec -v serve` verbose.
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log at INFO level")
    return p


def run(args: argparse.Namespace) -> int:
    # No cyclic collection until the first load is done (server/loading.py, collect_from_now_on): the imports and the
    # load make hundreds of thousands of objects, kept for good, which each full collection walked again.
    gc.disable()
    from speccomplete.server.early_stdin import EarlyStdin

    # stdin is read from here on, and a first start begins converting the model `initialize` names while the server
    # imports what it runs on (seconds, most of all with no bytecode cached yet).
    stdin = None if args.tcp else EarlyStdin(sys.stdin.buffer, on_initialize=convert_model_ahead)
    from speccomplete.server.lsp import serve

    serve(tcp=args.tcp, port=args.port, stdin=stdin)
    return 0


def convert_model_ahead(settings: dict) -> None:
    """The packaged model `initialize`'s settings name (or the default), converted in a process of its own where the
    model cache lacks it; the server's load then waits for that conversion (decoder/packaged.py, convert_ahead). Torch
    is not imported for it: the conversion starts while the server's imports begin."""
    from speccomplete.decoder.packaged import DEFAULT_TARGET, convert_ahead

    target = settings.get("target", DEFAULT_TARGET)
    if settings.get("backend", "local") == "local" and isinstance(target, str):
        try:
            convert_ahead(target)
        except Exception as e:  # a package's GGUF that cannot be assembled, a process that cannot start: the load
            log.warning("converting %s ahead: %s; the load converts it", target, e)  # converts and says why
