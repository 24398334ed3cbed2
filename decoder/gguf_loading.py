"""transformers' GGUF loading, made fast without changing what it gives: a reader of GGUF metadata in bulk, and
a block within which transformers reads, parses and names a GGUF's contents once (`fast_gguf_loading`)."""

from __future__ import annotations

import contextlib
import copy
import functools
import struct
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np


def gguf_reader(path: str | Path, elements: bool = True):
    """A gguf.GGUFReader that reads the metadata's arrays in bulk (docs/cpu.md, "What a start costs", has the times).

    With `elements`, the fields are GGUFReader's part for part: what transformers reads (load_gguf_checkpoint takes
    each element's part). GGUFReader reads each element of each array through a chain of Python calls that makes
    several memmap views; here an array of numbers is read once and split into its elements' views of a plain array,
    and an array of strings is walked with struct, each string a view of a plain array. Without `elements`, for what
    needs only the tensors and the scalars: an array of numbers is one part (contents() gives it whole) and an array
    of strings is stepped over (contents() gives nothing). Little-endian files only; others get the plain reader.
    """
    return bulk_reader_class(elements)(path)


@functools.cache
def bulk_reader_class(elements: bool) -> type:
    # from gguf's own module: fast_gguf_loading puts this class in the package's namespace for a while
    from gguf.gguf_reader import GGUFReader, GGUFValueType

    class BulkReader(GGUFReader):
        def _get_field_parts(self, orig_offs, raw_type):
            if GGUFValueType(raw_type) != GGUFValueType.ARRAY or self.byte_order != "I" or sys.byteorder != "little":
                return super()._get_field_parts(orig_offs, raw_type)
            item_type = self._get(orig_offs, np.uint32)
            count = self._get(orig_offs + 4, np.uint64)
            start, n = orig_offs + 12, int(count[0])
            item = GGUFValueType(int(item_type[0]))
            data = self.data.view(np.ndarray)  # views of a memmap pay for its bookkeeping; a plain array's do not
            # GGUFReader takes an array's item type from its first element: an empty array has none
            types = [GGUFValueType.ARRAY, item] if n else [GGUFValueType.ARRAY]
            if item == GGUFValueType.STRING:
                raw, end, lengths, texts = self.data.data, start, [], []
                for _ in range(n):
                    length = struct.unpack_from("<Q", raw, end)[0]
                    if elements:
                        lengths.append(length)
                        texts.append(data[end + 8 : end + 8 + length])
                    end += 8 + length
                if not elements:
                    return end - orig_offs, [item_type, count, data[start:end]], [], types
                parts = [item_type, count]
                for length_part, text in zip(np.array(lengths, np.uint64).reshape(-1, 1), texts):
                    parts += (length_part, text)
                return end - orig_offs, parts, list(range(3, 3 + 2 * n, 2)), types
            numpy_type = self.gguf_scalar_to_np.get(item)
            if numpy_type is None:  # arrays of arrays: rare, small, read the usual way
                return super()._get_field_parts(orig_offs, raw_type)
            values = data[start : start + n * np.dtype(numpy_type).itemsize].view(numpy_type)
            if not elements:
                return 12 + int(values.nbytes), [item_type, count, values], [2], types
            return 12 + int(values.nbytes), [item_type, count, *values.reshape(-1, 1)], list(range(2, 2 + n)), types

    return BulkReader


SWAP_LOCK = threading.RLock()


@contextlib.contextmanager
def fast_gguf_loading() -> Iterator[None]:
    """Within the block, transformers' GGUF loading reads the metadata in bulk, parses it without tensors once and
    names the tensors once; what it gives is unchanged (tests/decoder/test_gguf_safetensors.py compares its config,
    tokenizer and weights with transformers' own). The swap is process-wide: blocks on other threads wait for this
    one to end.

    - It reads a GGUF's metadata with gguf.GGUFReader (load_gguf_checkpoint), most of its time on a large
      vocabulary. Here gguf.GGUFReader is gguf_reader's class, which reads the same fields in bulk.
    - It parses every value, the vocabulary's too, for the config, for the tokenizer's config and again for the
      weights. Here a parse without tensors is kept for the block, and each caller gets a copy; the weights' call
      (with tensors) parses on its own.
    - It maps tensor names (get_gguf_hf_weights_map) module by module, building gguf's name map for the whole
      architecture again in each of a model's hundreds of modules. Here the map is built once.
    """
    import gguf
    from transformers import modeling_gguf_pytorch_utils as loading

    with SWAP_LOCK:
        plain_checkpoint = loading.load_gguf_checkpoint
        parsed = functools.cache(lambda path: plain_checkpoint(path, return_tensors=False))

        def load_gguf_checkpoint(path, return_tensors=False, *args, **kwargs):
            if return_tensors or args or kwargs:
                return plain_checkpoint(path, return_tensors, *args, **kwargs)
            return copy.deepcopy(parsed(path))

        swaps = [
            (gguf, "GGUFReader", bulk_reader_class(True)),
            (gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map)),
            (loading, "load_gguf_checkpoint", load_gguf_checkpoint),
        ]
        originals = [getattr(module, name) for module, name, _ in swaps]
        for module, name, fast in swaps:
            setattr(module, name, fast)
        try:
            yield
        finally:
            for (module, name, _), original in zip(swaps, originals, strict=True):
                setattr(module, name, original)
