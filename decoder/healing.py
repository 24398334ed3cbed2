"""Token healing: the prompt's last token is taken back, and the first generated token must begin with its text.

A prompt cut at the cursor often ends inside what training text tokenized as one token: Gemma's tokenizer
writes ` *` of a comment's continuation line and ` foo` after `= ` as single tokens, so a prompt ending in
`\\n ` or `x = ` ends in a lone ` ` token that the model has rarely seen followed by `*` or a word. It then
writes something unlike the code around it, or nothing. Taking the last token back and letting the model
choose any token that starts with its text (` `, ` *`, ` foo`, ...) puts the cut where the tokenizer would.

`heal` splits the prompt; `allowed_first` is the mask for the first generated token: the token taken back,
or its text joined to more than whitespace (the cursor's own whitespace is never extended). The engine
applies the mask to that token's logits alone (decoder/engine.py), in the verify as in plain decoding, so
greedy stays the target's greedy and sampling stays lossless: both decode under the masked first
distribution. The healed text is the prompt's, so the generated text starts after it (decoder/text.py).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import logging
import os
import threading
from pathlib import Path

import numpy as np
import tokenizers
import torch

log = logging.getLogger(__name__)

LAST_CHARACTER = "\U0010ffff"


def token_text(tokenizer, token_id: int) -> str:
    """One token's text on its own: through the fast tokenizer's decoder (no leading-space rules)."""
    return token_texts(tokenizer, [token_id])[0]


def token_texts(tokenizer, token_ids: list[int]) -> list[str]:
    """token_text of each of `token_ids`: one call to the fast tokenizer, in Rust with the GIL let go (each id's
    token through its decoder, as decoding it alone does)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.decoder is None:
        return [tokenizer.decode([token_id]) for token_id in token_ids]
    return backend.decode_batch([[token_id] for token_id in token_ids], skip_special_tokens=False)


# Every character str.isspace() holds: a continuation starting with one only extends the cursor's whitespace.
WHITESPACE = tuple(chr(c) for c in range(0x3001) if chr(c).isspace())  # none above U+3000


# One tokenizer's texts built at a time: a request that heals while a warm-up builds them waits for it
_BUILDING = threading.Lock()


def token_strings(tokenizer) -> tuple[list[str], torch.Tensor]:
    """Every token's text, sorted, and the token ids in that order; special tokens are left out. Built once per
    tokenizer (half a second over Gemma's 262k tokens) and kept in the model cache, read back in a tenth of that."""
    with _BUILDING:
        return _token_strings(tokenizer)


def warm_up(tokenizer) -> threading.Thread:
    """token_strings on a thread of its own, begun now: a server gets to ready without waiting for it."""
    thread = threading.Thread(target=token_strings, args=(tokenizer,), name="specdec-healing", daemon=True)
    thread.start()
    return thread


@functools.lru_cache(maxsize=4)
def _token_strings(tokenizer) -> tuple[list[str], torch.Tensor]:
    """From the disk cache where a tokenizer read from a file has one there, else built (and kept there)."""
    path = _kept_path(tokenizer)
    kept = _read_kept(path) if path is not None else None
    if kept is not None:
        return kept
    texts, ids = _sorted_texts(tokenizer)
    if path is not None:
        _keep(path, texts, ids)
    return texts, torch.tensor(ids, dtype=torch.long)


def _sorted_texts(tokenizer) -> tuple[list[str], list[int]]:
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    texts = token_texts(tokenizer, ids)
    kept = [k for k, text in enumerate(texts) if text]
    kept.sort(key=texts.__getitem__)  # by text alone: a stable sort keeps equal texts in id order
    return [texts[k] for k in kept], [ids[k] for k in kept]


# The disk cache's layout: a new one keys every table anew
FORMAT = 1


def _kept_path(tokenizer) -> Path | None:
    """Where the table of a tokenizer read from a folder's tokenizer.json is kept in the model cache, keyed by the
    file, the tokens added to it and the special ones, and the tokenizers library that decodes them; None for any
    other tokenizer (built each time)."""
    from .packaged import cache_root

    folder = getattr(tokenizer, "name_or_path", "")
    try:
        digest = hashlib.blake2b((Path(folder) / "tokenizer.json").read_bytes(), digest_size=16) if folder else None
    except OSError:
        digest = None
    if digest is None:
        return None
    facts = [FORMAT, tokenizers.__version__, len(tokenizer), sorted(tokenizer.all_special_ids)]
    digest.update(json.dumps(facts).encode())
    return cache_root() / "healing" / f"{digest.hexdigest()}.json"


def _read_kept(path: Path) -> tuple[list[str], torch.Tensor] | None:
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        texts, ids = kept["texts"], kept["ids"]
        if len(texts) != len(ids) or not all(isinstance(text, str) for text in texts):
            raise ValueError("texts and ids do not pair up")
        return texts, torch.from_numpy(np.array(ids, dtype=np.int64))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:  # a truncated or foreign file: built again
        log.warning("token healing's table %s is unreadable (%s); building it again", path, e)
        return None


def _keep(path: Path, texts: list[str], ids: list[int]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.part")
        partial.write_text(json.dumps({"texts": texts, "ids": ids}, ensure_ascii=False), encoding="utf-8")
        partial.replace(path)  # whole or not at all
    except (OSError, UnicodeEncodeError) as e:  # a read-only cache, a text that is not UTF-8: built each time
        log.warning("could not keep token healing's table in %s: %s", path, e)


def heal(tokenizer, ids: list[int]) -> tuple[list[int], str]:
    """The prompt without its last token, and that token's text; (ids, "") where nothing is to heal: a
    one-token prompt, a special token (a FIM prompt ends in one), a token that is not whole characters, or
    one no other token continues (`\\n`, `\\t`, runs of spaces in Gemma's vocabulary: it would only come back)."""
    if len(ids) < 2 or ids[-1] in set(tokenizer.all_special_ids):
        return ids, ""
    text = token_text(tokenizer, ids[-1])
    if not text or "\ufffd" in text:
        return ids, ""
    texts, _ = token_strings(tokenizer)
    itself = bisect.bisect_right(texts, text) - bisect.bisect_left(texts, text)
    if sum(end - start for start, end in _continuations(tokenizer, text)) == itself:
        return ids, ""
    return ids[:-1], text


@functools.lru_cache(maxsize=4096)
def _continuations(tokenizer, healed: str) -> tuple[tuple[int, int], ...]:
    """The places in `token_strings` order of the tokens that are `healed`, or `healed` and then more than
    whitespace: one range of the texts that start with `healed`, less the ranges that go on with whitespace.

    The whitespace at the cursor is the editor's: its indentation, its line break. A token that only
    extends it (`\\t\\t` after `\\t`, `\\n\\n` after `\\n`) would indent the completion again or start it
    with an empty line, so healing joins the cut to text, never to more whitespace."""
    texts, _ = token_strings(tokenizer)

    def starting(prefix: str, lo: int = 0) -> tuple[int, int]:
        start = bisect.bisect_left(texts, prefix, lo=lo)
        return start, bisect.bisect_left(texts, prefix + LAST_CHARACTER, lo=start)

    ranges, (start, end) = [], starting(healed)
    for space_start, space_end in sorted(starting(healed + c, start) for c in WHITESPACE):
        if space_start < space_end:
            ranges.append((start, space_start))
            start = space_end
    ranges.append((start, end))
    return tuple((lo, hi) for lo, hi in ranges if lo < hi)


@functools.lru_cache(maxsize=64)
def allowed_first(tokenizer, healed: str, vocab_size: int, device: torch.device) -> torch.Tensor:
    """The mask of the first generated token after a healed prompt: True for `_continuations`."""
    _, ids = token_strings(tokenizer)
    allowed = torch.zeros(vocab_size + 1, dtype=torch.bool)  # the last: ids past the head, dropped
    for start, end in _continuations(tokenizer, healed):
        allowed[ids[start:end].clamp(max=vocab_size)] = True
    return allowed[:vocab_size].to(device)
