"""tools/lean_wheel.py: a wheel without the trained drafts' weights, its RECORD without them, all else as it was."""

from __future__ import annotations

import zipfile

from tools import lean_wheel

KEPT = {
    "speccomplete/decoder/engine.py": b"engine",
    "speccomplete/decoder/weights/gemma3-270m-code/draft.json": b"{}",
    "speccomplete/decoder/weights/gemma3-270m-code/vocab_ids.safetensors": b"vocab",
    "speccomplete/decoder/meta/gemma3-270m.tar.xz": b"meta",
}
LEFT_OUT = {
    "speccomplete/decoder/weights/gemma3-270m-code/model.safetensors": b"w" * 1000,
    "speccomplete/decoder/weights/gemma3-270m-eagle3/model.safetensors": b"e" * 1000,
}
RECORD = "speccomplete-0.1.0.dist-info/RECORD"


def test_the_weights_and_their_record_lines_go_and_nothing_else(tmp_path):
    wheel = tmp_path / "speccomplete-0.1.0-py3-none-any.whl"
    files = KEPT | LEFT_OUT
    record = "".join(f"{name},sha256=x,{len(data)}\n" for name, data in files.items()) + f"{RECORD},,\n"
    with zipfile.ZipFile(wheel, "w") as out:
        for name, data in files.items():
            out.writestr(name, data)
        out.writestr(RECORD, record)
    assert sorted(lean_wheel.lean(wheel)) == sorted(LEFT_OUT)
    with zipfile.ZipFile(wheel) as lean:
        assert set(lean.namelist()) == set(KEPT) | {RECORD}
        assert all(lean.read(name) == data for name, data in KEPT.items())
        lines = lean.read(RECORD).decode().splitlines()
    assert [line.split(",")[0] for line in lines] == [*KEPT, RECORD]
    assert not wheel.with_name(wheel.name + ".lean").exists()
