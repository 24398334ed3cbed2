"""A case's workspace (harness/workspace.py): its language's files nearest first, never the case's own file,
and the references built from them keep the nearest."""

from __future__ import annotations

from speccomplete.harness.workspace import MAX_FILE_BYTES, nearest_files, read_texts, workspace_references


def _write(root, relative: str, text: str = "x = 1\n"):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_nearest_files_widen_a_folder_at_a_time(tmp_path):
    own = _write(tmp_path, "pkg/sub/own.py")
    _write(tmp_path, "pkg/sub/b.py")
    _write(tmp_path, "pkg/sub/a.py")
    _write(tmp_path, "pkg/sub/deeper/c.py")
    _write(tmp_path, "pkg/d.py")
    _write(tmp_path, "pkg/other/e.py")
    _write(tmp_path, "top.py")
    _write(tmp_path, "pkg/sub/notes.md", "# not python\n")  # another language
    _write(tmp_path, "pkg/node_modules/dep.py")  # dependencies are not the user's code
    _write(tmp_path, "pkg/.hidden/f.py")
    found = [str(p.relative_to(tmp_path)) for p in nearest_files(tmp_path, own, "python")]
    assert found == ["pkg/sub/a.py", "pkg/sub/b.py", "pkg/sub/deeper/c.py", "pkg/d.py", "pkg/other/e.py", "top.py"]
    assert [p.name for p in nearest_files(tmp_path, own, "python", max_files=2)] == ["a.py", "b.py"]


def test_headers_are_placed_by_their_text(tmp_path):
    own = _write(tmp_path, "own.c")
    _write(tmp_path, "plain.h", "int f(void);\n")
    _write(tmp_path, "templated.h", "template <typename T> T g(T);\n")
    assert [p.name for p in nearest_files(tmp_path, own, "c")] == ["plain.h"]
    assert [p.name for p in nearest_files(tmp_path, own, "cpp")] == ["templated.h"]


def test_large_and_unreadable_files_are_skipped(tmp_path):
    small = _write(tmp_path, "a.py", "small = True\n")
    large = _write(tmp_path, "b.py", "#" * (MAX_FILE_BYTES + 1))
    binary = tmp_path / "c.py"
    binary.write_bytes(b"\xff\xfe\x00")
    assert list(read_texts([small, large, binary, tmp_path / "gone.py"])) == ["small = True\n"]


def test_references_keep_the_nearest_texts():
    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    references = workspace_references(["abcdefgh", "ijklmnop", "qrstuvwx"], encode, max_tokens=10)
    assert references.documents == 2 and references.size == 10  # the nearest whole, the next cut to fit
    assert references.copy(encode("abcd"), 3) == encode("efg")  # the nearest is searched
    assert references.copy(encode("qrst"), 3) == []  # the farthest was never encoded
