"""harness/eagle3_gguf.py: an EAGLE-3 draft folder as llama.cpp's eagle3 GGUF, read back with gguf's
reader and run by llama.cpp itself (xllamacpp) as the draft of the tiny llama GGUF (harness/
tiny_gguf.py), whose greedy output it must leave unchanged.

The packaged Gemma-3 target cannot run it yet: the wheel's llama.cpp aborts in its Gemma-3 graph, which has
no layer inputs to hand the draft (docs/eagle3.md). The tiny target is a Llama, whose graph has them.
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch

from speccomplete.decoder.backends.llamacpp import _never_destroyed
from speccomplete.decoder.drafts.eagle3.model import (
    CONFIG_JSON,
    Eagle3,
    Eagle3LoadError,
    Eagle3Shape,
    save_eagle3,
    speculators_config,
)
from speccomplete.harness.eagle3_gguf import write_eagle3_gguf
from speccomplete.harness.tiny_gguf import HIDDEN, LAYERS, write_tiny_gguf

PROMPT = "def add(a, b):\n    return a + b\n\n"
VOCAB_IDS = torch.arange(0, 256, 2)  # the draft writes the even bytes
# grouped-query heads (the k rows are permuted per KV head) and the last target layer id, n_layer, which
# llama.cpp reads from the target's final state rather than a layer's input
SHAPE = Eagle3Shape(
    hidden_size=HIDDEN,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=96,
    target_vocab=259,
    draft_vocab=len(VOCAB_IDS),
    aux_layers=(0, 1, LAYERS),
    rope_theta=500.0,
    max_positions=512,
)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("target") / "tiny.gguf")


def _tensors(path) -> dict[str, np.ndarray]:
    return {t.name: np.asarray(t.data) for t in gguf.GGUFReader(path).tensors}


def _draft_folder(folder, target, head_from_target: bool):
    torch.manual_seed(0)
    draft = Eagle3(SHAPE)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape))
            elif p.dim() == 2:
                p.normal_(std=0.2)
    head = torch.nn.Linear(HIDDEN, SHAPE.target_vocab, bias=False)
    head.weight.data = torch.from_numpy(_tensors(target)["output.weight"].copy())
    draft.set_vocabulary(VOCAB_IDS, head)
    save_eagle3(draft, folder, speculators_config(SHAPE, ["LlamaForCausalLM"], "tiny", 3, head_from_target))
    return draft


@pytest.fixture(scope="module")
def converted(tmp_path_factory, target):
    folder = tmp_path_factory.mktemp("draft")
    draft = _draft_folder(folder / "eagle3", target, head_from_target=True)
    return draft, write_eagle3_gguf(folder / "eagle3", target, folder / "eagle3.gguf")


def _unpair(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's adjacent rope pairs back to rotate-half order."""
    rows, cols = weight.shape
    return weight.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def test_the_gguf_is_llama_cpps_eagle3_layout(converted, target):
    draft, path = converted
    reader = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.t")}
    assert fields["general.architecture"] == "eagle3"
    assert fields["eagle3.target_layers"] == [0, 1, LAYERS]
    assert fields["eagle3.target_hidden_size"] == HIDDEN and fields["eagle3.block_count"] == 1
    assert (fields["eagle3.attention.head_count"], fields["eagle3.attention.head_count_kv"]) == (4, 2)
    assert fields["eagle3.rope.freq_base"] == 500.0 and fields["eagle3.norm_before_residual"] is False
    target_reader = gguf.GGUFReader(target)
    assert reader.fields["tokenizer.ggml.tokens"].contents() == target_reader.fields["tokenizer.ggml.tokens"].contents()

    tensors, bf16 = _tensors(path), {k: v.to(torch.bfloat16).float().numpy() for k, v in draft.state_dict().items()}
    assert "token_embd.weight" not in tensors  # the target's embeddings are read
    np.testing.assert_array_equal(tensors["d2t"], VOCAB_IDS.numpy())  # absolute target ids
    # the left-out head is rebuilt from the target's rows
    np.testing.assert_allclose(tensors["output.weight"], _tensors(target)["output.weight"][VOCAB_IDS], atol=1e-3)
    f16 = {"rtol": 1e-3, "atol": 1e-6}  # bf16 weights written as f16
    q, k = _unpair(tensors["blk.0.attn_q.weight"], 4), _unpair(tensors["blk.0.attn_k.weight"], 2)
    np.testing.assert_allclose(q, bf16["layers.0.self_attn.q_proj.weight"], **f16)
    np.testing.assert_allclose(k, bf16["layers.0.self_attn.k_proj.weight"], **f16)
    np.testing.assert_allclose(tensors["fc.weight"], bf16["fc.weight"], **f16)
    np.testing.assert_array_equal(tensors["blk.0.attn_norm_2.weight"], bf16["layers.0.hidden_norm.weight"])


def test_a_folder_with_its_head_keeps_it(tmp_path, target):
    draft = _draft_folder(tmp_path / "eagle3", target, head_from_target=False)
    with torch.no_grad():  # a head of its own, no longer the target's rows
        draft.lm_head.weight.mul_(-1)
    save_eagle3(draft, tmp_path / "eagle3", json.loads((tmp_path / "eagle3" / CONFIG_JSON).read_text()))
    head = _tensors(write_eagle3_gguf(tmp_path / "eagle3", target, tmp_path / "e.gguf", "f32"))["output.weight"]
    np.testing.assert_array_equal(head, draft.lm_head.weight.to(torch.bfloat16).float().numpy())


def test_a_draft_for_another_target_is_refused(tmp_path, target):
    _draft_folder(tmp_path / "eagle3", target, head_from_target=True)
    config = json.loads((tmp_path / "eagle3" / CONFIG_JSON).read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [0, 1, LAYERS + 3]
    (tmp_path / "eagle3" / CONFIG_JSON).write_text(json.dumps(config))
    with pytest.raises(Eagle3LoadError, match="another target"):
        write_eagle3_gguf(tmp_path / "eagle3", target, tmp_path / "e.gguf")
    assert not (tmp_path / "e.gguf").exists()


def _complete(target, draft=None) -> dict:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(target)
    params.n_ctx, params.n_parallel = 512, 1
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = 1
    if draft is not None:
        params.speculative.types = [xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3]
        params.speculative.draft.mparams.path = str(draft)
        params.speculative.draft.n_max = 3
    server = xllamacpp.Server(params)
    _never_destroyed(server)  # as the backend does: xllamacpp's destructor can hang
    chunks: list[dict] = []
    server.handle_completions(
        {"prompt": PROMPT, "max_tokens": 40, "temperature": 0.0}, lambda chunk: chunks.append(chunk) or False
    )
    return chunks[-1]


def test_llama_cpp_drafts_with_it_and_decodes_as_without(converted, target):
    plain, drafted = _complete(target), _complete(target, converted[1])
    assert plain["timings"]["predicted_n"] == 40  # the tiny model never stops early
    assert drafted["choices"][0]["text"] == plain["choices"][0]["text"]
    timings = drafted["timings"]
    assert timings["predicted_n"] == 40 and timings["draft_n"] > 0
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
