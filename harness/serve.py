"""`specdec serve`: the language server, as editors start it."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve")
    p.add_argument("--tcp", action="store_true", help="listen on 127.0.0.1 instead of stdio")
    p.add_argument("--port", type=int, default=2087)
    # Also after `serve`, where an editor's server arguments put it; SUPPRESS keeps `specdec -v serve` verbose.
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log at INFO level")
    return p


def run(args: argparse.Namespace) -> int:
    from speccomplete.server.lsp import serve

    serve(tcp=args.tcp, port=args.port)
    return 0
