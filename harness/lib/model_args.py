"""The model arguments every model-running subcommand takes, and loading the decoder they describe."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

import torch

from speccomplete.decoder.models import DEFAULT_DRAFT, DEFAULT_TARGET, DEFAULT_TREE_NODES, STEPS

if TYPE_CHECKING:
    from speccomplete.decoder.loader import LoadedDecoder


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET, help="packaged alias, local directory or HF id")
    p.add_argument(
        "--draft",
        default=DEFAULT_DRAFT,
        help="draft spec (default: %(default)s): its syntax is documented once, in "
        "speccomplete.decoder.drafts.spec (decoder/drafts/spec.py)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    p.add_argument(
        "--gamma", default="heuristic", help="an integer >= 0 (fixed), heuristic[:START:MAX] or cost[:C:V] (cost model)"
    )
    p.add_argument(
        "--draft-confidence",
        type=float,
        default=0.0,
        help="stop drafting when the draft's top probability falls below this",
    )
    p.add_argument(
        "--tree-nodes",
        type=int,
        default=DEFAULT_TREE_NODES,
        help="the most drafts of a round's draft tree, several continuations verified in one pass (decoder/tree.py); "
        "0: chains (default: %(default)s)",
    )
    p.add_argument(
        "--no-pack",
        action="store_true",
        help="keep the stock nn.Linear weights on the CPU (no oneDNN packing, decoder/kernels.py)",
    )
    p.add_argument(
        "--quantization",
        default="auto",
        choices=("auto", "none", "int8"),
        help="int8: the target's linear weights in int8 with per-row scales, a quarter of the fp32 bytes, "
        "on the CPU (decoder/kernels.py, Int8Linear); none: packed fp32; auto (default): int8 where it runs",
    )
    p.add_argument(
        "--steps",
        default="auto",
        choices=STEPS,
        help="how the target runs: eager (input-shaped forwards, a growing cache), fixed (a few padded "
        "shapes, a fixed-address cache), compiled (on the CPU: eager steps with short feeds compiled once per "
        "machine and cached, decoder/compiled_step.py; on CUDA: fixed, under torch.compile, as CUDA graphs), "
        "graphs (our forward at fixed shapes recorded as CUDA graphs, decoder/graph_target.py); "
        "auto: graphs on CUDA (compiled for a family graphs do not run), eager on the CPU",
    )


def load(args: argparse.Namespace, pack: bool | None = None, quantization: str | None = None) -> LoadedDecoder:
    """The target, tokenizer, draft model and decoder the model arguments describe; `pack` overrides
    --no-pack (the bench packs only after building its other drafts from the plain weights), and
    `quantization` --quantization (the bench's second copy of the target)."""
    from speccomplete.decoder.loader import load_decoder

    return load_decoder(
        args.target,
        args.draft,
        device=args.device,
        dtype=args.dtype,
        gamma=args.gamma,
        draft_confidence=args.draft_confidence,
        tree_nodes=args.tree_nodes,
        pack=not args.no_pack if pack is None else pack,
        steps=args.steps,
        quantization=args.quantization if quantization is None else quantization,
    )


def device_name(model) -> str:
    """The model's device as results record it: with the GPU's name on CUDA."""
    if model.device.type == "cuda":
        return f"{model.device} ({torch.cuda.get_device_name(model.device)})"
    return str(model.device)


def add_backend_args(p: argparse.ArgumentParser) -> None:
    """The decode backend (server/options.py, `backend`): ours, llama.cpp in-process, or an OpenAI-compatible server."""
    from speccomplete.decoder.backends import BACKENDS
    from speccomplete.decoder.backends.llamacpp import SPECULATIVE

    p.add_argument("--backend", default="local", choices=BACKENDS, help="what decodes (default: %(default)s)")
    p.add_argument("--gguf", default=None, help="llamacpp: the GGUF file (default: the packaged target's own)")
    p.add_argument(
        "--llamacpp-speculative", default="none", choices=SPECULATIVE, help="llamacpp: llama.cpp's own drafting"
    )
    p.add_argument("--openai-url", default="http://127.0.0.1:8080/v1", help="openai: the server's base URL")
    p.add_argument("--openai-model", default=None, help="openai: the model name the server knows")
    p.add_argument(
        "--openai-api-key-env", default="OPENAI_API_KEY", help="openai: the environment variable with the API key"
    )


def model_options(args: argparse.Namespace) -> dict:
    """The server settings (camelCase, as initializationOptions) that `add_model_args` describes."""
    return {
        "target": args.target,
        "draft": args.draft,
        "device": args.device,
        "dtype": args.dtype,
        "quantization": args.quantization,
        "gamma": args.gamma,
        "draftConfidence": args.draft_confidence,
        "draftTreeNodes": args.tree_nodes,
    }


def backend_options(args: argparse.Namespace) -> dict:
    """The server settings (camelCase, as initializationOptions) that `add_backend_args` describes."""
    options = {
        "backend": args.backend,
        "llamacppSpeculative": args.llamacpp_speculative,
        "openaiUrl": args.openai_url,
        "openaiApiKeyEnv": args.openai_api_key_env,
    }
    if args.gguf:
        options["gguf"] = args.gguf
    if args.openai_model:
        options["openaiModel"] = args.openai_model
    return options


def add_options_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--options",
        help="extra server settings as a JSON object, camelCase as initializationOptions: "
        "'{\"maxTokensMultiLine\": 64}'",
    )


def extra_options(args: argparse.Namespace) -> dict:
    """The server settings --options names (`add_options_arg`), to go on top of the harness's own."""
    if not args.options:
        return {}
    extra = json.loads(args.options)
    if not isinstance(extra, dict):
        raise ValueError(f"--options must be a JSON object, got {args.options!r}")
    return extra
