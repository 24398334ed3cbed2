"""The prompt for one completion: prefix and suffix within a budget, cut at syntactic boundaries, and whether
to complete one line or a block.

What stays, in order, while it fits: the cursor's line; the innermost enclosing statement or definition whole;
the file header (imports, package and module lines, includes); the next enclosing definitions whole; their
siblings, nearest first (far ones are dropped first); then single lines nearest the cursor. Pieces are whole
lines, never parts of lines, except for a single cursor line that alone exceeds the budget.

The prefix starts stably while the user types (the backends keep the KV cache of the last prompt, and only what
differs is prefilled): past the budget, the file is split into pages of a quarter of the budget, at line starts.
The lines of the cursor's page up to the cursor are kept whole (the live part), and before them comes the
selection above for a cursor at the page's first line, within half the budget (the stable part). Typing
inside a page only appends to the prompt; the stable part changes when the cursor's line enters the next page.
Without pages, the selection moved with every line and a warm request reused about half of its prompt
(docs/benchmarks/README.md, section 10).

The budget is in characters (the `promptBudgetChars` setting, server/options.py). Code tokenizes to about
3.5 characters per token with the packaged models' tokenizers, so the default 2000 characters is about 570 tokens.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from tree_sitter import Node, Tree

from speccomplete.languages import LANGUAGES, TEXT
from speccomplete.server import syntax
from speccomplete.server.snippets import OpenDocument, context_block

DEFAULT_BUDGET_CHARS = 2000  # prefill runs ~175 tokens/s on a 2-core CPU, so context costs latency
SUFFIX_SHARE = 3  # nearest-first growth takes 3 lines before the cursor for each line after it
HEADER_SHARE = 4  # the header may use at most a quarter of the budget
HEADER_ROWS = 1000  # a header is at the top: look no further
PAGES = 4  # a page is a quarter of the budget: the live part's usual length, and the suffix's at most

# The end of the text before the cursor that opens a block (a multi-line completion follows), and the lines that
# belong to the file header, matched after indentation: each language's patterns are in speccomplete/languages.py.
BLOCK_OPENERS = {language.name: re.compile(rf"(?:{language.block_opener})\s*$") for language in (*LANGUAGES, TEXT)}
HEADERS = {language.name: re.compile(language.header) for language in LANGUAGES if language.header is not None}


@dataclass(frozen=True)
class Prompt:
    prefix: str
    suffix: str
    multiline: bool
    indent: str  # the cursor line's indentation
    language: str
    context: str = ""  # from beyond the prefix and suffix, put before the prefix (server/snippets.py)

    @property
    def model_prefix(self) -> str:
        """What the model reads before the cursor: the context, then the prefix."""
        return self.context + self.prefix


@dataclass(frozen=True)
class FimTokens:
    """A family's fill-in-the-middle markers, spelled as the tokenizer's vocabulary spells them (each is one
    added token there, so the prompt's text encodes each marker to its own id)."""

    prefix: str
    suffix: str
    middle: str
    # what the model writes when the middle is done, those the vocabulary has: the tokenizer's EOS for some
    # families, a token of its own for others (decoding stops there: fim_stop_ids)
    ends: tuple[str, ...] = ()
    # text between the prefix marker and a non-empty prefix: CodeLlama was trained on `<PRE> {prefix}`, the
    # prefix encoded with SentencePiece's leading space, and its tokenizer only adds that space at the start
    prefix_lead: str = ""


# Found by the markers in the vocabulary, never by the model's name: a fine-tune or a GGUF keeps its base's
# tokenizer under any name. Checked in this order; a vocabulary has at most one family's markers.
FIM_STYLES = (
    FimTokens("<fim_prefix>", "<fim_suffix>", "<fim_middle>", ("<|endoftext|>",)),  # StarCoder(2), SantaCoder
    # Qwen2.5-Coder ends with its EOS; CodeGemma with <|file_separator|> (its EOS is <eos>)
    FimTokens("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", ("<|endoftext|>", "<|file_separator|>")),
    FimTokens("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", ("<｜end▁of▁sentence｜>",)),  # DeepSeek-Coder
    # CodeLlama: SentencePiece pieces with their leading space (ids 32007-32010), which its tokenizer adds as
    # special tokens; the layout is `<PRE> {prefix} <SUF>{suffix} <MID>`
    FimTokens("▁<PRE>", "▁<SUF>", "▁<MID>", ("▁<EOT>",), prefix_lead=" "),
)


def fim_tokens(vocab) -> FimTokens | None:
    """The fill-in-the-middle tokens a tokenizer's vocabulary (any container of token strings: `get_vocab()`,
    added tokens included) has, if any."""
    return next((s for s in FIM_STYLES if s.prefix in vocab and s.suffix in vocab and s.middle in vocab), None)


class TokenIds(Mapping[str, int]):
    """A tokenizer's token -> id, one token at a time: what fim_tokens and fim_stop_ids ask of a vocabulary, without
    `get_vocab()`'s dict of every token (a third of a second for Gemma's 262k, on a start's path). A fast tokenizer
    answers from its Rust side, added tokens included; any other from its `get_vocab()`."""

    def __init__(self, tokenizer):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.token_to_id = backend.token_to_id if backend is not None else tokenizer.get_vocab().get
        self.tokenizer = tokenizer

    def __getitem__(self, token: str) -> int:
        found = self.token_to_id(token) if isinstance(token, str) else None
        if found is None:
            raise KeyError(token)
        return found

    def __iter__(self):
        return iter(self.tokenizer.get_vocab())

    def __len__(self) -> int:
        return len(self.tokenizer.get_vocab())


def fim_end_ids(tokens: FimTokens, vocab: Mapping[str, int]) -> frozenset[int]:
    """The ids of the tokens that end a middle in this vocabulary (token string -> id): a decode of a FIM prompt
    stops at any of them, as at EOS, else it writes on past the middle."""
    return frozenset(vocab[end] for end in tokens.ends if end in vocab)


def fim_stop_ids(tokens: FimTokens, vocab: Mapping[str, int]) -> frozenset[int]:
    """The ids a decode of a FIM prompt stops at: the ends of a middle, and the markers, which a model writes
    only once it has left the middle (a marker that is not a special token would otherwise show as text)."""
    markers = (tokens.prefix, tokens.suffix, tokens.middle)
    return fim_end_ids(tokens, vocab) | frozenset(vocab[m] for m in markers if m in vocab)


def format_fim(prompt: Prompt, tokens: FimTokens) -> str:
    """Prefix-suffix-middle order: the model writes the middle after the last token."""
    prefix = prompt.model_prefix
    lead = tokens.prefix_lead if prefix else ""
    return f"{tokens.prefix}{lead}{prefix}{tokens.suffix}{prompt.suffix}{tokens.middle}"


def build_prompt(
    text: str,
    offset: int,
    language: str,
    budget_chars: int = DEFAULT_BUDGET_CHARS,
    documents: tuple[OpenDocument, ...] = (),
    context_chars: int = 0,
) -> Prompt:
    """documents: the other open documents; context_chars: the budget of the block from beyond the
    prefix and suffix (server/snippets.py), over budget_chars; 0 for none."""
    if not 0 <= offset <= len(text):
        raise ValueError(f"offset {offset} is outside a {len(text)}-character document")
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    line_end = len(text) if line_end < 0 else line_end
    before, after = text[line_start:offset], text[offset:line_end]
    tree = syntax.parse(language, text)
    multiline = _multiline(before, after, language) and (
        tree is None or not _in_comment_or_string(tree, syntax.byte_len(text[:offset].rstrip(" \t")) - 1)
    )
    indent = before[: len(before) - len(before.lstrip(" \t"))]
    if len(text) <= budget_chars:
        prefix, suffix = text[:offset], text[offset:]
    elif len(before) + len(after) + 1 > budget_chars:
        prefix, suffix = _cut_long_line(before, after, budget_chars)
    else:
        prefix, suffix = _paged(text, offset, language, tree, budget_chars)
    context = context_block(text, offset, language, tree, prefix + suffix, documents, context_chars)
    return Prompt(prefix, suffix, multiline, indent, language, context)


def _paged(text: str, offset: int, language: str, tree: Tree | None, budget: int) -> tuple[str, str]:
    """The stable part (a selection for a cursor at the page's start, within half the budget) and the live part
    (the page up to the cursor, at most half the budget) before the cursor; whole lines after it in what is
    left, up to a page. A live part too long for its half (long lines) falls back to `select_lines` for the cursor."""
    page = max(1, budget // PAGES)
    line_start = text.rfind("\n", 0, offset) + 1
    anchor = _page_start(text, line_start, page)
    live = text[anchor:offset]
    if anchor == 0 or len(live) > budget - budget // 2:
        return select_lines(text, offset, language, tree, budget)
    head, room = text[:anchor], budget // 2
    stable = head if len(head) <= room else select_lines(head, anchor, language, syntax.parse(language, head), room)[0]
    return stable + live, _lines_after(text, offset, min(page, budget - len(stable) - len(live)))


def _page_start(text: str, line_start: int, page: int) -> int:
    """The first line start at or after the last multiple of `page` at or before `line_start` (a line start):
    edits at or below the cursor's line never move it."""
    boundary = line_start // page * page
    return text.find("\n", boundary - 1) + 1 if boundary > 0 else 0


def _lines_after(text: str, offset: int, budget: int) -> str:
    """The rest of the cursor's line and the whole lines after it that fit in `budget` characters."""
    end = text.find("\n", offset)
    if end < 0:
        return text[offset:]
    while True:
        following = text.find("\n", end + 1)
        following = len(text) if following < 0 else following
        if following - offset > budget or end >= len(text):
            return text[offset:end]
        end = following


def _multiline(before: str, after: str, language: str) -> bool:
    """An empty line, or the start of a block (the rest of the line empty or only closing brackets) is multi-line;
    an opener inside a comment or string is not (the caller checks that in the tree)."""
    if not before.strip():
        return not after.strip()
    if after.strip(" \t\r)]};,"):
        return False
    return bool(BLOCK_OPENERS.get(language, BLOCK_OPENERS[TEXT.name]).search(before))


def _in_comment_or_string(tree: Tree, byte: int) -> bool:
    node = tree.root_node.descendant_for_byte_range(byte, byte + 1)
    while node is not None:
        kind = node.type.lower()
        if "comment" in kind or "string" in kind:
            return True
        node = node.parent
    return False


def _cut_long_line(before: str, after: str, budget: int) -> tuple[str, str]:
    """A cursor line longer than the budget (minified code): cut it at word boundaries, most of it before."""
    keep_before = budget * SUFFIX_SHARE // (SUFFIX_SHARE + 1)
    head = before
    if len(before) > keep_before:
        head = before[len(before) - keep_before :]
        head = head[m.end() :] if (m := re.search(r"\W", head)) else head
    tail = after[: budget - len(head)]
    if len(tail) < len(after) and (cut := max(tail.rfind(" "), tail.rfind("\t"))) > 0:
        tail = tail[:cut]
    return head, tail


class _Rows:
    """The set of whole lines kept so far, within a character budget."""

    def __init__(self, lines: list[str], budget: int):
        self.lines, self.budget, self.used = lines, budget, 0
        self.rows: set[int] = set()

    def cost(self, first: int, last: int) -> int:
        return sum(len(self.lines[r]) + 1 for r in range(first, last + 1) if r not in self.rows)

    def add(self, first: int, last: int) -> bool:
        cost = self.cost(first, last)
        if self.used + cost > self.budget:
            return False
        self.rows.update(range(first, last + 1))
        self.used += cost
        return True

    def add_nearest(self, before: list[tuple[int, int]], after: list[tuple[int, int]], first: int, last: int):
        """Add row ranges nearest first (before: nearest first, ending above `first`; after: starting below `last`),
        taking SUFFIX_SHARE ranges before for one after; a side stops at its first range that does not fit."""
        i = j = 0
        while i < len(before) or j < len(after):
            take_before = j >= len(after) or (
                i < len(before) and first - before[i][1] <= SUFFIX_SHARE * (after[j][0] - last)
            )
            side = before if take_before else after
            k = i if take_before else j
            if not self.add(*side[k]):
                side[k:] = []
                continue
            if take_before:
                i += 1
            else:
                j += 1


def select_lines(text: str, offset: int, language: str, tree: Tree | None, budget: int) -> tuple[str, str]:
    """The selection of whole lines described at the top, for a cursor at `offset`: (prefix, suffix)."""
    lines = text.split("\n")
    row = text.count("\n", 0, offset)
    kept = _Rows(lines, budget)
    kept.add(row, row)
    if tree is not None:
        _add_structure(kept, tree, row, syntax.byte_len(text[:offset]), language, budget)
    else:
        _add_header(kept, None, row, language, budget)
    _bridge_blank_lines(kept)
    reach = budget - kept.used  # every line costs at least its newline
    kept.add_nearest(
        [(r, r) for r in range(row - 1, max(-1, row - 1 - reach), -1)],
        [(r, r) for r in range(row + 1, min(len(lines), row + 1 + reach))],
        row,
        row,
    )
    rows = sorted(kept.rows)
    line_start = text.rfind("\n", 0, offset) + 1
    prefix = "".join(lines[r] + "\n" for r in rows if r < row) + text[line_start:offset]
    line_end = text.find("\n", offset)
    suffix = text[offset : len(text) if line_end < 0 else line_end] + "".join("\n" + lines[r] for r in rows if r > row)
    return prefix, suffix


def _bridge_blank_lines(kept: _Rows):
    """Blank lines between two kept lines keep the layout (two blank lines between Python definitions)."""
    r, last = min(kept.rows), max(kept.rows)
    while r < last:
        if r in kept.rows or kept.lines[r].strip():
            r += 1
            continue
        end = r
        while end + 1 < len(kept.lines) and end + 1 not in kept.rows and not kept.lines[end + 1].strip():
            end += 1
        if r - 1 in kept.rows and end + 1 in kept.rows:
            kept.add(r, end)
        r = end + 1


def _add_structure(kept: _Rows, tree: Tree, row: int, byte: int, language: str, budget: int):
    """Enclosing statements and definitions whole, innermost first, then the header, then siblings nearest first."""
    scopes = []  # statement-level ancestors of the cursor, innermost first
    node = tree.root_node.descendant_for_byte_range(byte, byte)
    while node is not None and node.parent is not None:
        if node.is_named and syntax.is_container(node.parent):
            scopes.append(node)
        node = node.parent
    inner: Node | None = None
    container: Node | None = tree.root_node
    for depth, scope in enumerate(scopes):
        fits = kept.add(scope.start_point.row, scope.end_point.row)
        if depth == 0:
            _add_header(kept, tree, row, language, budget)
        if not fits:
            kept.add(scope.start_point.row, scope.start_point.row)  # its signature line
            container = inner.parent if inner is not None else None
            break
        inner = scope
    if not scopes:
        _add_header(kept, tree, row, language, budget)
    if container is None:
        return
    first, last = (inner.start_point.row, inner.end_point.row) if inner is not None else (row, row)
    units = _units(container, exclude=inner)
    kept.add_nearest([u for u in reversed(units) if u[1] < first], [u for u in units if u[0] > last], first, last)


def _units(container: Node, exclude: Node | None) -> list[tuple[int, int]]:
    """Row ranges of a container's children; a comment goes with the child that follows it."""
    units, comment_start = [], None
    for child in container.named_children:
        if exclude is not None and child == exclude:
            comment_start = None
            continue
        if "comment" in child.type.lower():
            comment_start = child.start_point.row if comment_start is None else comment_start
            continue
        start = child.start_point.row if comment_start is None else comment_start
        units.append((start, child.end_point.row))
        comment_start = None
    return units


def _add_header(kept: _Rows, tree: Tree | None, row: int, language: str, budget: int):
    pattern = HEADERS.get(language)
    if pattern is None:
        return
    cap = budget // HEADER_SHARE
    for r in range(min(row, HEADER_ROWS)):
        line = kept.lines[r]
        indent = len(line) - len(line.lstrip())
        if r in kept.rows or not pattern.match(line, indent):
            continue
        last = r
        if tree is not None:  # a multi-line import: keep the whole statement
            leaf = tree.root_node.descendant_for_point_range((r, indent), (r, indent))
            statement = syntax.statement_begun_on_row(leaf, r) if leaf is not None else None
            last = statement.end_point.row if statement is not None else r
        cost = kept.cost(r, last)
        if cost <= cap and kept.add(r, last):
            cap -= cost
