"""Context from beyond the prompt (server/snippets.py): definitions this file names, windows of other
open documents, and a block that stays put while the user types."""

from __future__ import annotations

from speccomplete.server import syntax
from speccomplete.server.prompt import build_prompt
from speccomplete.server.snippets import (
    QUERY_STRIDE,
    OpenDocument,
    context_block,
)

# a helper far above the cursor, then filler the prompt's budget leaves out, then code that calls it
HELPER = '''import os


def parse_header(blob: bytes, *, strict: bool = False) -> dict[str, str]:
    """Split a header blob into fields."""
    fields = {}
    for line in blob.split(b"\\n"):
        key, _, value = line.partition(b":")
        fields[key.decode()] = value.decode().strip()
    return fields


class Unused:
    def never_named(self):
        return 1
'''
FILLER = "".join(f"\n\ndef filler_{i}(x):\n    return x * {i} + {i}\n" for i in range(60))
CALLER = """

def load(path):
    with open(path, "rb") as f:
        blob = f.read()
    header = parse_header(blob)
    size = header.get("size")
    name = header.get("name")
    kind = header.get("kind")
    return header


def main():
    result = load(os.environ["FILE"])
    print(result)
    """
FILE = HELPER + FILLER + CALLER


def block(text: str, offset: int, documents=(), budget=500, language="python") -> str:
    prompt = build_prompt(text, offset, language, 600, documents, budget)
    assert prompt.context == context_block(
        text, offset, language, syntax.parse(language, text), prompt.prefix + prompt.suffix, documents, budget
    )
    return prompt.context


def test_a_definition_named_above_the_cursor_but_cut_from_the_prompt_comes_back_as_its_signature():
    prompt = build_prompt(FILE, len(FILE), "python", 600, (), 500)
    assert "def parse_header" not in prompt.prefix  # the budget left it out
    assert prompt.context == (
        "# Definitions used below, from this file:\n"
        "# def parse_header(blob: bytes, *, strict: bool = False) -> dict[str, str]:\n"
    )
    assert prompt.model_prefix == prompt.context + prompt.prefix


def test_definitions_in_the_prompt_or_not_named_are_left_out():
    whole = build_prompt(FILE, len(FILE), "python", 100_000, (), 500)  # the whole file fits: nothing to add
    assert whole.context == ""
    assert "never_named" not in block(FILE, len(FILE))
    assert block(FILE, len(FILE), budget=0) == ""


def test_c_declarators_name_their_definitions():
    helper = "static int checksum(const unsigned char *data, size_t length) {\n    return 0;\n}\n"
    filler = "".join(f"static int filler_{i}(int x) {{\n    return x + {i};\n}}\n\n" for i in range(40))
    caller = "int verify(const unsigned char *buf, size_t n) {\n    int sum = checksum(buf, n);\n    return sum;\n}\n"
    text = helper + filler + caller + "\n" * QUERY_STRIDE
    assert "// static int checksum(const unsigned char *data, size_t length)\n" in block(text, len(text), language="c")


def test_the_most_similar_window_of_another_open_document_in_the_language_is_quoted():
    other = OpenDocument(
        "/home/me/project/pkg/headers.py",
        "import sys\n\n\ndef dump(header):\n    size = header.get('size')\n    name = header.get('name')\n"
        "    kind = header.get('kind')\n    return size, name, kind\n",
    )
    unrelated = OpenDocument("/home/me/project/pkg/maths.py", "def area(radius):\n    return 3.14 * radius * radius\n")
    elsewhere = OpenDocument("/home/me/project/web/app.js", other.text)  # same words, another language
    got = block(FILE, len(FILE), (unrelated, elsewhere, other), budget=1000)
    assert "# Compare this snippet from pkg/headers.py:\n# import sys\n#\n#\n# def dump(header):\n" in got
    assert "#     size = header.get('size')\n" in got
    assert "maths.py" not in got and "app.js" not in got
    assert got.index("Definitions used below") < got.index("Compare this snippet")
    assert len(got) <= 1000


def test_pieces_that_do_not_fit_the_budget_are_left_out():
    other = OpenDocument("a/b.py", "\n".join(f"header = parse_header(blob)  # {i}" for i in range(20)))
    signature_only = block(FILE, len(FILE), (other,), budget=120)
    assert "parse_header" in signature_only and "Compare this snippet" not in signature_only
    assert len(signature_only) <= 120
    assert block(FILE, len(FILE), (other,), budget=20) == ""


def test_typing_on_a_line_or_starting_a_few_more_leaves_the_block_as_it_was():
    other = OpenDocument("a/b.py", "def show(result):\n    print(result)\n    return result\n")
    start = block(FILE, len(FILE), (other,))
    assert start
    typed = FILE + "print(result, file=sys.stderr)"
    assert block(typed, len(typed), (other,)) == start
    row = FILE.count("\n")
    more = FILE + "x = 1\n    " * (QUERY_STRIDE - 1 - row % QUERY_STRIDE)  # new lines, same stride
    assert block(more, len(more), (other,)) == start


def test_each_line_is_commented_the_language_s_way():
    text = (
        "let rec checksum_bytes data acc =\n"
        "  match data with [] -> acc | x :: rest -> checksum_bytes rest (acc + x)\n\n"
        + "".join(f"let filler_{i} x = x + {i}\n" for i in range(80))
        + "let verify buf =\n  let sum = checksum_bytes buf 0 in\n  sum\n"
        + "\n" * QUERY_STRIDE
    )
    got = block(text, len(text), language="ocaml")
    assert got.startswith("(* Definitions used below, from this file: *)\n(* let rec checksum_bytes")
    assert block("hello\n" * 50, 300, language="text") == ""  # no comment syntax: no block


def test_the_server_offers_the_other_open_documents_most_recently_used_first():
    from lsprotocol import types
    from pygls.workspace import Workspace

    from speccomplete.server.lsp import SpecdecServer

    server = SpecdecServer()
    server.protocol._workspace = Workspace(None, types.TextDocumentSyncKind.Incremental)
    for name in ("a", "b", "c", "d"):
        server.workspace.put_text_document(types.TextDocumentItem(f"file:///p/{name}.py", "python", 1, name))
    server.touch("file:///p/c.py")
    server.touch("file:///p/a.py")
    server.touch("file:///p/b.py")  # the document asked for: not its own neighbour
    got = server.other_documents("file:///p/b.py")
    assert [(d.path, d.text) for d in got] == [("/p/a.py", "a"), ("/p/c.py", "c"), ("/p/d.py", "d")]


def test_a_window_longer_than_the_budget_left_is_cut_from_its_end_but_not_below_a_few_lines():
    lines = (f"size_{i} = header.get('size', {i})  # blob name kind\n" for i in range(20))
    other = OpenDocument("a/b.py", "".join(lines))
    got = block(FILE, len(FILE), (other,), budget=400)
    snippet = got[got.index("# Compare this snippet from a/b.py:\n") :].splitlines()[1:]
    assert len(snippet) == 4 and len(got) <= 400  # of the window's 10 lines, the first 4
    assert snippet[0].startswith("# size_10 = ") and snippet[-1].startswith("# size_13 = ")
    assert "Compare this snippet" not in block(FILE, len(FILE), (other,), budget=240)  # room for 2 lines only
