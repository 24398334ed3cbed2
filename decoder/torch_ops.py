"""Our C kernels as torch operators (torch_ops.cpp), which a compiled step calls from C++.

A compiled step (compiled_step.py) reaches the int8 products and the attention through operators. Defined in
Python (kernels.opaque_linear, lean_forward.attend_tree_rows), each of a step's ~90 calls goes through Python;
registered from C++, AOTInductor calls them directly (docs/cpu.md, "The compiled step's operators"). The same C
functions compute either way, so the numbers do not change.

The operators are built against torch's headers with the system's C++ compiler (seconds), only by what compiles or
loads a step (never on a request's path), and kept under the model cache (c_kernels.py). Where they cannot be
built, `int8_rows_op()` and `attend_rows_op()` are False with one log line, and a compiled step calls the Python
operators as before.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from . import attend_rows, c_kernels, int8_rows

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("torch_ops.cpp")

# The operators' schemas and their shapes for tracing; their CPU kernels come from SOURCE once it is loaded.
_LIBRARY = torch.library.Library("specdec", "FRAGMENT")
_LIBRARY.define("int8_rows(Tensor x, Tensor weight, Tensor sums) -> Tensor")
_LIBRARY.define(
    "attend_rows(Tensor queries, Tensor keys, Tensor values, SymInt start, Tensor parents, int? window, float scale, "
    "float? cap) -> Tensor"
)


@torch.library.register_fake("specdec::int8_rows", lib=_LIBRARY)
def _int8_rows_shape(x, weight, sums):
    return x.new_empty(x.shape[0], sums.shape[0])


@torch.library.register_fake("specdec::attend_rows", lib=_LIBRARY)
def _attend_rows_shape(queries, keys, values, start, parents, window, scale, cap):
    return queries.new_empty(queries.shape)


def int8_rows_op() -> bool:
    """Whether `torch.ops.specdec.int8_rows` runs the int8 rows kernel here."""
    return int8_rows.available() and _loaded()


def attend_rows_op() -> bool:
    """Whether `torch.ops.specdec.attend_rows` runs the attention rows kernel here."""
    return attend_rows.available() and _loaded()


@functools.cache
def _loaded() -> bool:
    library = c_kernels.load(
        SOURCE, _flags(), libraries=_libraries(), missing=_why_not(), fallback="compiled steps call Python operators",
        declare=_hand_in_kernels, check=_checks, log=log,
    )  # fmt: skip
    return library is not None


def _why_not() -> str:
    return "" if c_kernels.cxx_compiler() else "no C++ compiler (g++, or $CXX)"


def _hand_in_kernels(library: ctypes.CDLL) -> None:
    """Loading the library registered the operators' CPU kernels; they call the C kernels at these addresses."""
    rows_library = int8_rows._library()
    tile, chunk = int8_rows._layout(rows_library) if rows_library else (1, 1)
    int8, attend = (_address(module, name) for module, name in ((int8_rows, "int8_rows"), (attend_rows, "attend_rows")))
    library.specdec_set_kernels(int8, ctypes.c_int64(tile), ctypes.c_int64(chunk), attend)


def _checks(library: ctypes.CDLL) -> bool:
    """Whether each operator gives what its kernel gives through ctypes, bit for bit, where that kernel runs."""
    generator = torch.Generator().manual_seed(0)
    if int8_rows.available():
        x = torch.randint(-127, 128, (3, 130), generator=generator).float()
        plain = torch.randint(-127, 128, (13, 130), dtype=torch.int8, generator=generator)
        weight, sums = int8_rows.laid_out(plain), plain.sum(1, dtype=torch.int32)
        if not torch.equal(torch.ops.specdec.int8_rows(x, weight, sums), int8_rows.products(x, weight, sums)):
            return False
    if attend_rows.available():
        queries = torch.randn(1, 4, 3, 16, generator=generator)
        keys, values = (torch.randn(1, 2, 9, 16, generator=generator) for _ in range(2))
        got = torch.ops.specdec.attend_rows(queries, keys, values, 5, torch.tensor([-1, 0, 0]), 4, 0.25, None)
        if not torch.equal(got, attend_rows.attend(queries, keys, values, 5, [-1, 0, 0], 4, 0.25, None)):
            return False
    return True


def _address(module, name: str) -> ctypes.c_void_p:
    """The address of a C kernel's function (NULL where it is not available: its operator is then not used)."""
    library = module._library()
    return ctypes.c_void_p(ctypes.cast(getattr(library, name), ctypes.c_void_p).value if library else None)


def _flags() -> tuple[str, ...]:
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    return ("-O2", "-std=c++17", abi, f"-I{Path(torch.__file__).parent / 'include'}")


def _libraries() -> tuple[str, ...]:
    lib = Path(torch.__file__).parent / "lib"
    return (f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}")
