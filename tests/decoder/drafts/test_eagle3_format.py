"""The EAGLE-3 draft's folder format (decoder/drafts/eagle3/model.py) read by the `speculators` package itself, whose
format vLLM and SGLang serve: its config classes parse config.json, its Eagle3DraftModel takes model.safetensors
and computes the same next-token logits as Eagle3.step. Then load_eagle3's round trip and its refusals.

speculators is installed with --no-deps (.ci/setup says why); only the tests that import it skip without it.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny_models import tiny_llama
from helpers.tokenizers import BYTE_VOCAB
from safetensors.torch import load_file

from speccomplete.decoder.drafts.eagle3.model import (
    CONFIG_JSON,
    WEIGHTS,
    Eagle3,
    Eagle3LoadError,
    Eagle3Shape,
    KVCache,
    init_from_target,
    is_eagle3_draft,
    load_eagle3,
    read_config,
    save_eagle3,
    speculators_config,
)

TARGET_LAYERS = 6
DRAFT_VOCAB = 64
SPEC_TOKENS = 3
# What speculators' Eagle3DraftModel holds that a draft folder never does: the target's embeddings and its
# training-only verifier head and norm (core.py's _keys_to_ignore_on_load_missing lists them)
SPECULATORS_OWN = {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"}


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=3, layers=TARGET_LAYERS)


def _shape(kind: str, target) -> Eagle3Shape:
    if kind == "for_target":  # 32 wide: one 32-wide head
        return Eagle3Shape.for_target(target, draft_vocab=DRAFT_VOCAB)
    # grouped-query heads whose total width differs from the hidden size, a non-default rope base and eps,
    # the last layer id (num_layers) that speculators allows, and the raw feature half as the residual
    return Eagle3Shape(
        hidden_size=32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=96,
        target_vocab=BYTE_VOCAB,
        draft_vocab=DRAFT_VOCAB,
        aux_layers=(1, 2, TARGET_LAYERS),
        rms_norm_eps=1e-5,
        rope_theta=500.0,
        max_positions=512,
        norm_before_residual=False,
    )


SHAPES = ["for_target", "gqa"]


def _vocab_ids(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(BYTE_VOCAB, generator=g)[:DRAFT_VOCAB].sort().values


def _draft(shape: Eagle3Shape, target) -> Eagle3:
    """init_from_target, with norms moved off 1 and the layer weights scaled up, so a swapped or misread weight
    changes the logits visibly (init_from_target's 0.02 weights would leave them near the head's bias-free rows)."""
    draft = init_from_target(shape, target, _vocab_ids())
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 2 and not name.startswith("lm_head"):
                p.mul_(10)
    return draft


def _save(draft: Eagle3, folder, target_name: str | None = None, head_from_target: bool = False) -> None:
    config = speculators_config(
        draft.shape, ["LlamaForCausalLM"], target_name, SPEC_TOKENS, head_from_target, extra={"test": True}
    )
    save_eagle3(draft, folder, config)


def _features(target, shape: Eagle3Shape, ids: torch.Tensor) -> torch.Tensor:
    """[1, T, 3h]: the target's states entering layers aux_layers (hidden_states[k]), concatenated in order."""
    with torch.no_grad():
        states = target(ids.to(target.device), output_hidden_states=True).hidden_states
    return torch.cat([states[k] for k in shape.aux_layers], dim=-1).float().cpu()


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().to(torch.bfloat16).float()


# --- speculators reads the folder -------------------------------------------------------------------------


def _speculators_model(folder, attn: str = "sdpa"):
    """speculators' own model for `folder`, built from its config with a dense attention (its default, flex
    attention, has no CPU path here), our weights loaded as it loads a checkpoint."""
    pytest.importorskip("speculators")
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(folder))
    config.transformer_layer_config._attn_implementation = attn
    model = Eagle3DraftModel(config).eval()
    missing, unexpected = model.load_state_dict(load_file(str(folder / WEIGHTS)), strict=False)
    return model, set(missing), set(unexpected)


@pytest.mark.parametrize("kind", SHAPES)
def test_speculators_config_classes_read_the_config(tmp_path, target, kind):
    pytest.importorskip("speculators")
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    shape = _shape(kind, target)
    _save(_draft(shape, target), tmp_path, target_name="some/target")
    generic = SpeculatorModelConfig.from_pretrained(str(tmp_path))
    assert isinstance(generic, Eagle3SpeculatorConfig)  # its registry resolves speculators_model_type
    config = Eagle3SpeculatorConfig.from_pretrained(str(tmp_path))
    assert config.speculators_model_type == "eagle3"
    assert config.draft_vocab_size == DRAFT_VOCAB and config.target_vocab_size == BYTE_VOCAB
    assert config.eagle_aux_hidden_state_layer_ids == list(shape.aux_layers)
    assert config.norm_before_residual == shape.norm_before_residual
    assert not (config.norm_before_fc or config.fc_norm or config.norm_output)
    layer = config.transformer_layer_config
    assert layer.model_type == "llama" and layer.num_hidden_layers == 1
    assert (layer.hidden_size, layer.num_attention_heads, layer.num_key_value_heads, layer.head_dim) == (
        shape.hidden_size,
        shape.num_heads,
        shape.num_kv_heads,
        shape.head_dim,
    )
    assert layer.intermediate_size == shape.intermediate_size and layer.vocab_size == shape.target_vocab
    assert layer.rms_norm_eps == shape.rms_norm_eps
    assert layer.rope_parameters["rope_theta"] == shape.rope_theta
    spec = config.speculators_config
    assert spec.algorithm == "eagle3" and spec.default_proposal_method == "greedy"
    assert spec.proposal_methods[0].speculative_tokens == SPEC_TOKENS
    assert spec.verifier.name_or_path == "some/target" and spec.verifier.architectures == ["LlamaForCausalLM"]


@pytest.mark.parametrize("head_from_target", [False, True])
@pytest.mark.parametrize("kind", SHAPES)
def test_the_weights_fill_speculators_model_exactly(tmp_path, target, kind, head_from_target):
    draft = _draft(_shape(kind, target), target)
    _save(draft, tmp_path, head_from_target=head_from_target)
    model, missing, unexpected = _speculators_model(tmp_path)
    assert unexpected == set()
    assert missing == SPECULATORS_OWN | ({"lm_head.weight"} if head_from_target else set())
    theirs = model.state_dict()
    for name, ours in draft.state_dict().items():
        if name in missing:
            continue
        assert theirs[name].shape == ours.shape, name
        if ours.is_floating_point():
            assert torch.equal(theirs[name], _bf16(ours)), name
        else:  # d2t (int64 offsets) and t2d (bool mask) keep their dtypes
            assert theirs[name].dtype == ours.dtype and torch.equal(theirs[name], ours.cpu()), name


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", SHAPES)
def test_speculators_forward_gives_our_logits(tmp_path, target, kind, attn):
    """speculators' training forward over one sequence, two TTT steps, against Eagle3.step.

    Its conventions (core.py, and data.py's shift_batch before it): for a sequence x_0..x_T, row i holds the
    target's states g_i at x_i and the next token x_{i+1}, at position i + 1; step 0 predicts the token after
    x_{i+1}. Step 1 feeds row i's pre-norm output back with the true x_{i+2} at position i + 2, attending to
    step 0's rows 0..i and itself. Ours: step() the rows into a cache, then per row i one more step() over the
    cache cut to rows 0..i, as the decoder drafts a second token from there."""
    shape = _shape(kind, target)
    _save(_draft(shape, target), tmp_path)
    model, _, _ = _speculators_model(tmp_path, attn)
    embed = target.get_input_embeddings().weight.detach().cpu().float()
    with torch.no_grad():
        model.embed_tokens.weight.copy_(embed)
    logits: list[torch.Tensor] = []
    model.lm_head.register_forward_hook(lambda _m, _a, out: logits.append(out.detach()[0]))
    t = 12
    seq = torch.randint(0, BYTE_VOCAB, (1, t + 1), generator=torch.Generator().manual_seed(5))
    features, ids = _features(target, shape, seq[:, :t]), seq[:, 1:]
    with torch.no_grad():
        tokens = model(hidden_states=features, input_ids=ids, document_ids=torch.zeros_like(ids), ttt_steps=2)
    assert len(tokens) == 2 and len(logits) == 2

    draft = load_eagle3(tmp_path, target)  # on the target's device (SPECDEC_TEST_DEVICE); compared on the CPU
    dev = draft.fc.weight.device
    x, embed, features = ids[0].to(dev), embed.to(dev), features.to(dev)
    with torch.no_grad():
        cache = KVCache()
        out0 = draft.step(embed[x], draft.fuse(features[0]), 1 + torch.arange(t, device=dev), cache)
        ours0 = draft.logits(out0).cpu()
        ours1 = []
        for i in range(t - 1):  # speculators' last row has no next true token (it pads with id 0)
            rows = KVCache()
            rows.append(cache.keys[:, :, : i + 1], cache.values[:, :, : i + 1])
            out1 = draft.step(embed[x[i + 1]][None], out0[i][None], torch.tensor([i + 2], device=dev), rows)
            ours1.append(draft.logits(out1)[0].cpu())
    assert ours0.argmax(-1).unique().numel() > 3  # rows that disagree, so agreeing on them means something
    torch.testing.assert_close(logits[0], ours0, rtol=1e-4, atol=1e-5)
    assert torch.equal(tokens[0][0], ours0.argmax(-1))  # draft ids: target id = id + d2t[id]
    torch.testing.assert_close(logits[1][: t - 1], torch.stack(ours1), rtol=1e-4, atol=1e-5)


def test_speculators_from_pretrained_loads_the_folder_with_the_target_beside_it(tmp_path, target):
    """speculators' own loader (from_pretrained, the verifier named by path) over a folder with its head: every
    weight of ours arrives, and our aux layer ids survive its check against the verifier's depth.

    Neither the head (with head_from_target) nor the embeddings are checked after it: speculators fills those
    from the verifier only where they are still NaN, and under this repo's transformers (newer than speculators
    pins) a weight missing from the checkpoint comes back uninitialised memory, NaN only by chance. vLLM does not
    run this code; folders meant for speculators or vLLM keep their head (docs/eagle3.md)."""
    pytest.importorskip("speculators")
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    target_dir, draft_dir = tmp_path / "target", tmp_path / "draft"
    target.save_pretrained(target_dir)
    draft = _draft(_shape("for_target", target), target)
    _save(draft, draft_dir, str(target_dir))
    config = Eagle3SpeculatorConfig.from_pretrained(str(draft_dir))
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = Eagle3DraftModel.from_pretrained(str(draft_dir), config=config, dtype=torch.float32)
    assert model.config.eagle_aux_hidden_state_layer_ids == list(draft.shape.aux_layers)
    theirs = model.state_dict()
    for name, ours in draft.state_dict().items():
        assert torch.equal(theirs[name], _bf16(ours) if ours.is_floating_point() else ours.cpu()), name


# --- load_eagle3 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head_from_target", [False, True])
def test_load_eagle3_round_trip(tmp_path, target, head_from_target):
    draft = _draft(_shape("gqa", target), target)
    _save(draft, tmp_path, head_from_target=head_from_target)
    saved = load_file(str(tmp_path / WEIGHTS))
    assert ("lm_head.weight" in saved) != head_from_target
    assert not any(k.startswith("embed_tokens") for k in saved)  # the target's embeddings are shared
    assert read_config(tmp_path)["head_from_target"] is head_from_target

    loaded = load_eagle3(tmp_path, target)
    assert loaded.shape == draft.shape
    assert not any(p.requires_grad for p in loaded.parameters())
    theirs = loaded.state_dict()
    assert set(theirs) == set(draft.state_dict())
    for name, ours in draft.state_dict().items():
        if ours.is_floating_point():
            expected = ours.detach().cpu() if name == "lm_head.weight" and head_from_target else _bf16(ours)
            assert theirs[name].dtype == target.dtype
            torch.testing.assert_close(theirs[name].cpu(), expected, rtol=0, atol=0, msg=name)
        else:
            assert torch.equal(theirs[name].cpu(), ours.cpu()), name
    # a left-out head comes back as the target's rows for the draft's ids, at full precision
    head = target.get_output_embeddings().weight.detach().cpu()
    assert torch.equal(loaded.target_ids().cpu(), _vocab_ids())
    if head_from_target:
        assert torch.equal(loaded.lm_head.weight.cpu(), head[_vocab_ids()])


@pytest.mark.parametrize(
    "other, message",
    [
        (lambda: tiny_llama(seed=3, layers=TARGET_LAYERS, hidden=48), "hidden size 48, the draft's 32"),
        (lambda: tiny_llama(seed=3, layers=TARGET_LAYERS, vocab=300), "vocabulary 300, the draft's 258"),
        (lambda: tiny_llama(seed=3, layers=4), "4 layers, the draft reads layer 6"),
    ],
)
def test_a_draft_for_another_target_is_refused(tmp_path, target, other, message):
    _save(_draft(_shape("gqa", target), target), tmp_path)
    with pytest.raises(Eagle3LoadError, match=f"made for another target.*{message}"):
        load_eagle3(tmp_path, other())


def test_a_folder_without_its_head_needs_head_from_target(tmp_path, target):
    draft = _draft(_shape("gqa", target), target)
    _save(draft, tmp_path, head_from_target=True)
    config = read_config(tmp_path)
    config["head_from_target"] = False
    (tmp_path / CONFIG_JSON).write_text(json.dumps(config))
    with pytest.raises(Eagle3LoadError, match="no lm_head.weight"):
        load_eagle3(tmp_path, target)


def test_only_eagle3_folders_are_eagle3_drafts(tmp_path, target):
    ok = tmp_path / "eagle3"
    _save(_draft(_shape("for_target", target), target), ok)
    assert is_eagle3_draft(ok)
    llama = tmp_path / "llama"
    target.save_pretrained(llama)  # a model folder, config.json without speculators_model_type
    other = tmp_path / "other"
    other.mkdir()
    config = read_config(ok)
    config["speculators_model_type"] = "mlp_speculator"
    (other / CONFIG_JSON).write_text(json.dumps(config))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / CONFIG_JSON).write_text("{")
    listed = tmp_path / "listed"
    listed.mkdir()
    (listed / CONFIG_JSON).write_text("[]")
    for folder in (llama, other, broken, listed, tmp_path / "missing"):
        assert not is_eagle3_draft(folder), folder.name
        with pytest.raises(Eagle3LoadError):
            load_eagle3(folder, target)
