"""End the completion where the syntax node it belongs to closes, by parsing prefix + completion.

After a block opener or mid-line (the cursor line has text), the node is the statement or definition begun on
the cursor's row (`def f(x):`, `if (x) {`, `} else {`). On an empty line it is the enclosing block: the
completion ends where that block ends (a dedent in Python, its `}` or `end` elsewhere); at the top level, where
the top-level item it begins ends. A node has closed when text follows it, or when it ends in its own closing
token (`}`, `end`, `;`). The suffix is left out of the parse: whatever follows would extend the node."""

from __future__ import annotations

from tree_sitter import Node

from speccomplete.server import syntax
from speccomplete.server.filters.context import TrimContext

CLOSERS = frozenset({"}", ")", "]", ";", "end", "fi", "done", "esac"})


def cut(completion: str, ctx: TrimContext) -> int | None:
    if not completion.strip():
        return None
    text = ctx.prefix + completion
    tree = syntax.parse(ctx.language, text)
    if tree is None:
        return None
    data = syntax.encode(text)
    start = syntax.byte_len(ctx.prefix)
    node = _scope(
        tree.root_node, ctx, start, start + syntax.byte_len(completion) - syntax.byte_len(completion.lstrip())
    )
    if node is None or node.has_error or node.end_byte <= start or not _closed(node, data):
        return None
    return len(data[start : node.end_byte].decode("utf-8", "surrogatepass"))


def _scope(root: Node, ctx: TrimContext, start: int, first: int) -> Node | None:
    if ctx.line_before.strip():
        last = syntax.byte_len(ctx.prefix.rstrip(" \t")) - 1
        leaf = root.descendant_for_byte_range(last, last + 1)
        return syntax.statement_begun_on_row(leaf, ctx.prefix.count("\n")) if leaf is not None else None
    child = root.descendant_for_byte_range(first, first + 1)
    while child is not None and child.parent is not None:
        parent = child.parent
        if parent.is_error:  # error recovery cut the statement loose from its block: its end means nothing
            return None
        if syntax.is_container(parent) and parent.start_byte <= start:
            return child if parent.parent is None else parent
        child = parent
    return None


def _closed(node: Node, data: bytes) -> bool:
    if data[node.end_byte :].strip():
        return True
    leaf = node
    while leaf.child_count:
        leaf = leaf.children[-1]
    parent = leaf.parent
    assert parent is not None  # `_scope` never returns the root, so `leaf` is not the root either
    return (
        not leaf.is_named
        and not leaf.is_missing
        and leaf.type in CLOSERS
        and (parent == node or syntax.is_container(parent))
    )
