"""CUDA graphs captured directly (torch.cuda.CUDAGraph), behind one seam the CPU tests drive eagerly.

A `Captured` wraps a function of static buffers: it reads its inputs from tensors allocated once and
returns tensors. On CUDA the function is recorded once, when the `Captured` is made, and every call
replays the recording: one launch for the hundreds of kernels of a decode step, no Python in between.
Elsewhere every call runs the function eagerly on the same buffers, so the CPU tests exercise the same
shapes, the same buffers and the same code, all but the recording.

Recording takes milliseconds (vLLM and SGLang capture this way; torch.compile's cudagraph trees record
lazily on a graph's second call and compile first, ~24 s a graph on an H200). `recordings()` counts them,
so a benchmark can check that none happened inside a timed run.

A replay writes the same output tensors every time: a caller copies what it keeps before the next call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_recordings = 0
_pools: dict[int, Any] = {}  # device index -> the memory pool every graph on it shares


def recordings() -> int:
    """CUDA graphs recorded in this process so far."""
    return _recordings


class Captured:
    """`fn()` recorded as a CUDA graph on a CUDA device, run eagerly elsewhere; call it to run it."""

    def __init__(self, fn: Callable[[], Any], device: torch.device, warmups: int = 2):
        self.fn = fn
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Any = None
        if device.type == "cuda":
            self._record(device, warmups)

    def _record(self, device: torch.device, warmups: int) -> None:
        global _recordings
        # warm on a side stream first, as PyTorch's recipe says: cuBLAS workspaces and the allocator's
        # blocks are set up there, not inside the recording
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmups):
                self.fn()
        torch.cuda.current_stream(device).wait_stream(side)
        pool = _pools.setdefault(device.index or 0, torch.cuda.graph_pool_handle())
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = self.fn()
        _recordings += 1

    def __call__(self) -> Any:
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.outputs
