"""The decode roofline: the memory bandwidth torch sees, and the weight bytes one decode step reads.
`specdec bench` sets AR's tokens/s against the bound they make; `specdec stepcost` its steps' times against the
time to read those bytes."""

from __future__ import annotations

import statistics
import time

import torch


def memory_bandwidth_gbs(device: torch.device | str = "cpu", megabytes: int = 512, repeats: int = 5) -> float:
    """Read bandwidth of the device's memory as torch sees it: the median time to sum a large buffer."""
    buffer = torch.ones(megabytes * 2**20 // 4, device=device)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        buffer.sum().item()  # .item() waits for a GPU to finish
        times.append(time.perf_counter() - start)
    return buffer.numel() * 4 / statistics.median(times[1:]) / 1e9


def weight_bytes_per_token(model, int8: bool = False) -> int:
    """Bytes of weights one decode step reads: every parameter, except an untied input embedding
    (a step reads one row of it). A tied embedding is read whole, as the head. With `int8`, the
    linear weights count one byte each (decoder/kernels.py, Int8Linear; its scales are left out)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # tied weights count once
    if int8:
        linears = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
        total -= sum(w.numel() * (w.element_size() - 1) for w in linears.values())
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or getattr(head, "weight", None) is not embedding:
        total -= embedding.numel() * embedding.element_size()
    return total
