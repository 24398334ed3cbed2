"""The fast GGUF conversion (decoder/gguf_safetensors.py) writes what transformers' conversion (convert_gguf) writes:
the same tensors, byte for byte, and the same metadata files, for a tiny llama (q/k rows permuted by llama.cpp), a
tiny Gemma 3 (norm weights stored as w + 1, quantized tensors) and a tiny Qwen2 (biases, a tied head), with a meta
built from transformers' conversion or from the GGUF alone; and transformers' loading, made fast
(decoder/gguf_loading.py), gives what it gave."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize
from safetensors import safe_open

from speccomplete.decoder.gguf_loading import fast_gguf_loading, gguf_reader
from speccomplete.decoder.gguf_safetensors import (
    FAST_DEQUANTIZERS,
    MetaMismatchError,
    UnhandledArchitectureError,
    convert_with_meta,
    differing_tensors,
    meta_from_gguf,
    pack_meta,
    write_meta,
)
from speccomplete.decoder.models import convert_gguf, load_model
from speccomplete.harness.tiny_gguf import write_tiny_gguf


def tiny_writer(path: Path, architecture: str, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int):
    """A GGUFWriter for a tiny model of `architecture`, its shape written."""
    writer = GGUFWriter(str(path), architecture)
    writer.add_name(f"tiny-{architecture}")
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    return writer


def finish(writer, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_gemma3_gguf(path: Path, seed: int = 0) -> Path:
    """Two Gemma 3 layers (d_model 64, 4 heads of 16, 2 KV heads) with a sentencepiece vocabulary of bytes and
    letters, laid out as llama.cpp writes Gemma 3: norms as w + 1 around 1, most matrices Q8_0 or Q4_0."""
    hidden, layers, heads, kv_heads, head_dim, ffn = 64, 2, 4, 2, 16, 128
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += ["\u2581", "\u2581\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    types = [3, 3, 3, 2] + [6] * 256 + [1] * (len(tokens) - 260)  # control, unknown, byte, normal
    scores = [0.0] * 260 + [-float(i) for i in range(len(tokens) - 260)]
    rng = np.random.RandomState(seed)
    writer = tiny_writer(path, "gemma3", hidden, layers, heads, kv_heads, ffn)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_sliding_window(64)
    writer.add_file_type(GGMLQuantizationType.Q8_0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(0)
    writer.add_unk_token_id(3)

    def matrix(name: str, rows: int, cols: int, qtype: GGMLQuantizationType | None = GGMLQuantizationType.Q8_0):
        values = (rng.standard_normal((rows, cols)) * 0.2).astype(np.float32)
        if qtype is None:
            writer.add_tensor(name, values)
        else:
            blocks = quantize(values, qtype)
            writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)

    def norm(name: str, size: int):
        writer.add_tensor(name, (1 + rng.standard_normal(size) * 0.1).astype(np.float32))

    matrix("token_embd.weight", len(tokens), hidden)
    norm("output_norm.weight", hidden)
    for i in range(layers):
        norm(f"blk.{i}.attn_norm.weight", hidden)
        matrix(f"blk.{i}.attn_q.weight", heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden, GGMLQuantizationType.Q4_0)
        matrix(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden, None)
        matrix(f"blk.{i}.attn_output.weight", hidden, heads * head_dim)
        norm(f"blk.{i}.attn_q_norm.weight", head_dim)
        norm(f"blk.{i}.attn_k_norm.weight", head_dim)
        norm(f"blk.{i}.post_attention_norm.weight", hidden)
        norm(f"blk.{i}.ffn_norm.weight", hidden)
        matrix(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_up.weight", ffn, hidden)
        writer.add_tensor(f"blk.{i}.ffn_down.weight", (rng.standard_normal((hidden, ffn)) * 0.2).astype(np.float16))
        norm(f"blk.{i}.post_ffw_norm.weight", hidden)
    return finish(writer, path)


def write_tiny_qwen2_gguf(path: Path, seed: int = 0) -> Path:
    """Two Qwen2 layers (d_model 64, 4 heads, 2 KV heads, biases on q, k and v) with a tied head and the tiny llama's
    byte-level vocabulary, as llama.cpp writes Qwen2 (q and k rows as transformers has them)."""
    from speccomplete.harness.tiny_gguf import bytes_to_unicode

    hidden, layers, heads, kv_heads, ffn = 64, 2, 4, 2, 128
    spelling = bytes_to_unicode()
    space = spelling[ord(" ")]
    tokens = [spelling[b] for b in range(256)] + ["<|endoftext|>", space * 2]
    rng = np.random.RandomState(seed)
    writer = tiny_writer(path, "qwen2", hidden, layers, heads, kv_heads, ffn)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(GGMLQuantizationType.Q8_0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 256 + [3, 1])
    writer.add_token_merges([f"{space} {space}"])
    writer.add_eos_token_id(256)
    writer.add_bos_token_id(256)

    def tensor(name: str, *shape: int, quantized: bool = True):
        values = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        if quantized:
            blocks = quantize(values, GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, values)

    kv = hidden // heads * kv_heads
    tensor("token_embd.weight", len(tokens), hidden)
    tensor("output_norm.weight", hidden, quantized=False)
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", hidden, quantized=False)
        tensor(f"blk.{i}.attn_q.weight", hidden, hidden)
        tensor(f"blk.{i}.attn_q.bias", hidden, quantized=False)
        tensor(f"blk.{i}.attn_k.weight", kv, hidden)
        tensor(f"blk.{i}.attn_k.bias", kv, quantized=False)
        tensor(f"blk.{i}.attn_v.weight", kv, hidden)
        tensor(f"blk.{i}.attn_v.bias", kv, quantized=False)
        tensor(f"blk.{i}.attn_output.weight", hidden, hidden)
        tensor(f"blk.{i}.ffn_norm.weight", hidden, quantized=False)
        tensor(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_up.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_down.weight", hidden, ffn)
    return finish(writer, path)


TINY_WRITERS = {"llama": write_tiny_gguf, "gemma3": write_tiny_gemma3_gguf, "qwen2": write_tiny_qwen2_gguf}


@pytest.fixture(scope="module", params=sorted(TINY_WRITERS))
def converted(request, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(GGUF, transformers' conversion of it, the meta folder built from that)."""
    tmp = tmp_path_factory.mktemp(request.param)
    gguf = TINY_WRITERS[request.param](tmp / f"tiny-{request.param}.gguf")
    reference = convert_gguf(gguf, tmp / "transformers")
    return gguf, reference, write_meta(reference, gguf, tmp / "meta")


def same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names
    )


def test_the_fast_conversion_writes_what_transformers_writes(converted, tmp_path):
    gguf, reference, meta = converted
    fast = convert_with_meta(gguf, meta, tmp_path / "fast")
    assert differing_tensors(reference, fast) == []
    assert same_files(reference, fast)  # model.safetensors byte for byte, and every metadata file
    with safe_open(str(fast / "model.safetensors"), framework="numpy") as saved:
        if "gemma" in gguf.name:  # the norms were stored around 1: transformers' -1 brings them back around 0
            assert abs(saved.get_tensor("model.norm.weight").mean()) < 0.2
        elif "llama" in gguf.name:  # q is permuted back: not the GGUF's rows as stored
            stored = next(t for t in GGUFReader(gguf).tensors if t.name == "blk.0.attn_q.weight").data
            assert not np.array_equal(saved.get_tensor("model.layers.0.self_attn.q_proj.weight"), stored)
        else:  # Qwen2's biases are kept, and its head is its embedding
            assert "model.layers.0.self_attn.q_proj.bias" in saved.keys() and "lm_head.weight" not in saved.keys()
    (model, tokenizer), (reference_model, reference_tokenizer) = (
        load_model(str(d), device="cpu") for d in (fast, reference)
    )
    ids = tokenizer("def f(x):", return_tensors="pt").input_ids
    assert ids.tolist() == reference_tokenizer("def f(x):", return_tensors="pt").input_ids.tolist()
    assert torch.equal(model(ids).logits, reference_model(ids).logits)


def test_the_meta_travels_as_one_archive(converted, tmp_path):
    gguf, reference, meta = converted
    archive = pack_meta(meta, tmp_path / "meta.tar.xz")
    assert same_files(reference, convert_with_meta(gguf, archive, tmp_path / "fast"))


def test_a_meta_from_another_gguf_is_refused(converted, tmp_path):
    gguf, _, meta = converted
    other = (
        write_tiny_gguf(tmp_path / "other.gguf")
        if "gemma" in gguf.name
        else write_tiny_gemma3_gguf(tmp_path / "o.gguf")
    )
    with pytest.raises(MetaMismatchError, match="another GGUF"):
        convert_with_meta(other, meta, tmp_path / "fast")
    assert not (tmp_path / "fast").exists() and not list(tmp_path.glob(".fast-*"))  # nothing left behind


def test_a_meta_from_the_gguf_alone_converts_as_transformers_does(converted, tmp_path):
    gguf, reference, _ = converted
    meta = meta_from_gguf(gguf, tmp_path / "meta")
    assert same_files(reference, convert_with_meta(gguf, meta, tmp_path / "fast"))


def test_a_meta_is_not_built_for_an_architecture_whose_tensors_transformers_reshapes(tmp_path, monkeypatch):
    from transformers import modeling_gguf_pytorch_utils

    bloom = tmp_path / "tiny-bloom.gguf"
    finish(tiny_writer(bloom, "bloom", 64, 1, 4, 4, 128), bloom)  # one we know of
    with pytest.raises(UnhandledArchitectureError, match="'bloom' is not handled"):
        meta_from_gguf(bloom, tmp_path / "meta")
    # one that a later transformers gives a tensor processor of its own
    processors = {**modeling_gguf_pytorch_utils.TENSOR_PROCESSORS, "qwen2": object}
    monkeypatch.setattr(modeling_gguf_pytorch_utils, "TENSOR_PROCESSORS", processors)
    with pytest.raises(UnhandledArchitectureError, match="'qwen2' is not handled"):
        meta_from_gguf(write_tiny_qwen2_gguf(tmp_path / "tiny-qwen2.gguf"), tmp_path / "meta")
    assert not (tmp_path / "meta").exists()


def test_fast_gguf_loading_gives_what_transformers_gives(converted):
    import gguf as gguf_package
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = converted[0]

    def load():
        where = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
        config = AutoConfig.from_pretrained(**where).to_dict()
        tokenizer = AutoTokenizer.from_pretrained(**where).backend_tokenizer.to_str()
        return config, tokenizer, AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32).state_dict()

    plain_reader = gguf_package.GGUFReader
    config, tokenizer, weights = load()
    with fast_gguf_loading():
        assert gguf_package.GGUFReader is not plain_reader
        fast_config, fast_tokenizer, fast_weights = load()
    assert gguf_package.GGUFReader is plain_reader  # put back
    assert (fast_config, fast_tokenizer) == (config, tokenizer)
    assert weights.keys() == fast_weights.keys() and all(torch.equal(weights[k], fast_weights[k]) for k in weights)


def test_fast_gguf_loading_puts_everything_back_when_its_block_fails():
    import gguf as gguf_package
    from transformers import modeling_gguf_pytorch_utils

    before = gguf_package.GGUFReader, gguf_package.get_tensor_name_map, modeling_gguf_pytorch_utils.load_gguf_checkpoint
    with pytest.raises(RuntimeError, match="inside"), fast_gguf_loading():
        with fast_gguf_loading():  # nested: the lock is the thread's own
            pass
        raise RuntimeError("inside")
    assert (
        gguf_package.GGUFReader,
        gguf_package.get_tensor_name_map,
        modeling_gguf_pytorch_utils.load_gguf_checkpoint,
    ) == before


def write_odd_arrays_gguf(path: Path) -> Path:
    """A GGUF of metadata only, with what gguf's writer will not write: an empty array, and an array of arrays."""

    def key(name: str) -> bytes:
        return struct.pack("<Q", len(name)) + name.encode()

    u32, array = 4, 9
    empty = key("test.empty") + struct.pack("<IIQ", array, u32, 0)
    nested = key("test.nested") + struct.pack("<IIQ", array, array, 2)
    nested += struct.pack("<IQ", u32, 2) + struct.pack("<2I", 7, 8) + struct.pack("<IQ", u32, 1) + struct.pack("<I", 9)
    body = struct.pack("<IIQQ", 0x46554747, 3, 0, 2) + empty + nested
    path.write_bytes(body + b"\0" * (-len(body) % 32))
    return path


@pytest.fixture(params=["model", "odd arrays"])
def any_gguf(request, converted, tmp_path) -> Path:
    return converted[0] if request.param == "model" else write_odd_arrays_gguf(tmp_path / "odd.gguf")


def test_the_bulk_reader_reads_what_gguf_reader_reads_part_for_part(any_gguf):
    """transformers reads through the parts (load_gguf_checkpoint), gguf's own code through contents()."""
    plain, bulk = GGUFReader(any_gguf), gguf_reader(any_gguf)
    assert bulk.data_offset == plain.data_offset and list(bulk.fields) == list(plain.fields)
    for ours, theirs in zip(bulk.tensors, plain.tensors, strict=True):
        assert (ours.name, ours.tensor_type, ours.data_offset) == (theirs.name, theirs.tensor_type, theirs.data_offset)
        assert np.array_equal(ours.data, theirs.data)
    for key, field in plain.fields.items():
        ours = bulk.fields[key]
        assert (ours.offset, ours.data, ours.types) == (field.offset, field.data, field.types), key
        assert len(ours.parts) == len(field.parts), key
        for a, b in zip(ours.parts, field.parts):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), key
        assert ours.contents() == field.contents(), key
    if "tokenizer.ggml.tokens" in plain.fields:
        assert len(plain.fields["tokenizer.ggml.tokens"].contents()) > 256
    else:
        assert plain.fields["test.empty"].contents() == [] and plain.fields["test.nested"].contents() == [7, 8, 9]


def test_the_bulk_reader_without_elements_reads_numbers_whole_and_steps_over_strings(converted):
    gguf = converted[0]
    plain, bulk = GGUFReader(gguf), gguf_reader(gguf, elements=False)
    assert bulk.data_offset == plain.data_offset and list(bulk.fields) == list(plain.fields)
    for key, field in plain.fields.items():
        if field.types[-1] != 8 or field.types[0] != 9:  # all but the arrays of strings
            assert bulk.fields[key].contents() == field.contents(), key
    assert bulk.fields["tokenizer.ggml.tokens"].contents() == []  # stepped over, not read
    assert len(bulk.fields["tokenizer.ggml.token_type"].data) == 1  # one part holds the values


@pytest.mark.parametrize("kind", sorted(FAST_DEQUANTIZERS))
def test_the_fast_dequantizers_give_gguf_values_bit_for_bit(kind):
    """Values of every size and sign, zeros and a row of one value among them, and both of Q5_0's nibble halves."""
    qtype = GGMLQuantizationType[kind]
    rng = np.random.RandomState(7)
    values = (rng.standard_normal((48, 256)) * rng.uniform(1e-3, 30, (48, 1))).astype(np.float32)
    values[3], values[5] = 0.0, 1.5
    rows = quantize(values, qtype)
    out = np.full(values.shape, np.nan, np.float32)
    FAST_DEQUANTIZERS[kind](rows, out)
    assert np.array_equal(out.view(np.uint32), dequantize(rows, qtype).view(np.uint32))
    assert np.abs(out - values).max() <= np.abs(values).max() / 8  # and they are the values quantized


@pytest.fixture
def packaged_tiny(converted, tmp_path, monkeypatch) -> tuple[Path, Path, Path]:
    """`converted`'s GGUF as the packaged alias "tiny", its meta shipped, with a model cache of its own."""
    from speccomplete.decoder import packaged

    gguf, reference, meta = converted
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(packaged.PACKAGED, "tiny", SimpleNamespace(gguf_path=lambda: gguf))
    monkeypatch.setattr(packaged, "SHIPPED_META", tmp_path / "meta")
    pack_meta(meta, tmp_path / "meta" / "tiny.tar.xz")
    return converted


def test_a_model_converts_with_its_shipped_meta_else_its_own_metadata_else_through_transformers(
    packaged_tiny, tmp_path, monkeypatch
):
    from speccomplete.decoder import models

    gguf, reference, meta = packaged_tiny
    slow = []
    monkeypatch.setattr(models, "convert_gguf", lambda *args: slow.append(args) or convert_gguf(*args))
    reports = []
    fast = Path(models.resolve("tiny", progress=lambda fraction, message: reports.append((fraction, message))))
    assert slow == [] and same_files(reference, fast)
    assert reports[0][0] < 0.01 and reports[0][1] == f"converting {gguf.name}: tensors"
    assert reports[-1] == (1.0, f"converted {gguf.name}")
    # a package whose GGUF changed: its meta no longer fits, and a meta from the GGUF's own metadata converts it
    shutil.rmtree(fast)
    other = (
        write_tiny_gguf(tmp_path / "other.gguf")
        if "gemma" in gguf.name
        else write_tiny_gemma3_gguf(tmp_path / "o.gguf")
    )
    monkeypatch.setitem(models.PACKAGED, "tiny", SimpleNamespace(gguf_path=lambda: other))
    reports.clear()
    assert Path(models.resolve("tiny", progress=lambda fraction, message: reports.append((fraction, message)))) == fast
    assert slow == [] and same_files(convert_gguf(other, tmp_path / "other-reference"), fast)
    assert {f"converting {other.name}: metadata", f"converting {other.name}: tensors"} <= {m for _, m in reports}
    # a GGUF that lacks a tensor of its model: said, and not converted through transformers, which would fill it in
    shutil.rmtree(fast)

    def failing(error: Exception):
        return lambda *args: (_ for _ in ()).throw(error)

    monkeypatch.setattr(models, "meta_from_gguf", failing(MetaMismatchError("no tensor of o.gguf is the model's")))
    with pytest.raises(MetaMismatchError, match="no tensor"):
        models.resolve("tiny")
    assert slow == [] and not fast.exists()
    # an architecture whose tensors transformers reshapes: transformers converts it, as before
    monkeypatch.setattr(models, "meta_from_gguf", failing(UnhandledArchitectureError("'bloom' is not handled")))
    assert Path(models.resolve("tiny")) == fast and len(slow) == 1 and (fast / "model.safetensors").is_file()
    assert not list((tmp_path / "cache" / "models").glob(".tiny-*"))  # no scratch left behind


def test_a_conversion_started_ahead_is_the_one_the_load_waits_for(packaged_tiny, tmp_path, monkeypatch):
    """convert_ahead (a first start's, harness/serve.py) converts in a process of its own; resolve waits for it and
    converts nothing itself. Where that process fails, resolve converts as it would have."""
    from speccomplete.decoder import models, packaged

    gguf, reference, meta = packaged_tiny
    monkeypatch.setattr(packaged, "CONVERTING_AHEAD", {})
    here = []
    monkeypatch.setattr(models, "convert_with_meta", lambda *args: here.append(args) or convert_with_meta(*args))
    assert packaged.convert_ahead("tiny") and not packaged.convert_ahead("tiny")  # one conversion at a time
    ahead = packaged.CONVERTING_AHEAD["tiny"]
    reports = []
    folder = Path(models.resolve("tiny", progress=lambda fraction, message: reports.append((fraction, message))))
    assert ahead.returncode == 0 and here == [] and same_files(reference, folder)
    assert reports[-1] == (1.0, "converted tiny")
    assert not packaged.convert_ahead("tiny") and "tiny" not in packaged.CONVERTING_AHEAD  # converted: nothing to do
    assert not packaged.convert_ahead("no-such-alias")  # no shipped meta: the load converts as it always did

    shutil.rmtree(folder)
    (tmp_path / "meta" / "tiny.tar.xz").write_bytes(b"not an archive")  # the process ahead fails on it
    assert packaged.convert_ahead("tiny")
    # converted here: the shipped meta tried again, then a meta from the GGUF's own metadata
    assert models.resolve("tiny") == str(folder) and len(here) == 2 and here[1][2] == folder
    assert same_files(reference, folder)
    assert packaged.CONVERTING_AHEAD == {}


def test_a_meta_archive_with_anything_but_plain_files_is_refused(tmp_path):
    import io
    import tarfile

    from speccomplete.decoder.gguf_safetensors import unpack_meta

    archive = tmp_path / "meta.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        member = tarfile.TarInfo("../outside.json")
        member.size = 2
        tar.addfile(member, io.BytesIO(b"{}"))
    with pytest.raises(MetaMismatchError, match="not a plain file"):
        unpack_meta(archive, tmp_path / "out")
    assert not (tmp_path / "outside.json").exists()
