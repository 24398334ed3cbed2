"""GPT-2's byte-level alphabet, which the tests' byte-level BPE vocabularies are written in."""

from __future__ import annotations


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which the ByteLevel pre-tokenizer uses."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}
