"""What the drop-ins share: the builders they forward to, the launch wrapper and the argument checks.

The builders are looked up through this module's names at call time (``_common._build_page_table(...)``),
so that tests can route them per backend in one place.
"""

from __future__ import annotations

import functools
import inspect

import torch

from ...ops.dcp_page_table import create_dcp_page_table as _build_dcp_page_table
from ...ops.dcp_token_csr import create_dcp_kv_indices as _build_dcp_token_csr
from ...ops.draft_decode import create_draft_decode_kv_indices as _build_draft_decode
from ...ops.mha_page_table import create_trtllm_mha_page_table as _build_mha_page_table
from ...ops.page_table import create_flashmla_kv_indices as _build_page_table
from ...ops.token_csr import create_flashinfer_kv_indices as _build_token_csr
from ...ops.translated_page_table import create_translated_page_table as _build_translated_page_table
from ..._validate import _INT32_MAX, _python_int, _tensor

__all__ = ["_build_dcp_page_table", "_build_dcp_token_csr", "_build_draft_decode", "_build_mha_page_table",
           "_build_page_table", "_build_token_csr", "_build_translated_page_table"]

# The bound of sizes, widths and strides given as Python ints (a tensor's extent).
_EXTENT_MAX = 2**63 - 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


_GRID_PADDING = {1: (1, 1), 2: (1,), 3: ()}


def _launch_grid(grid, arguments):
    """A Triton launch grid as ``(x, y, z)``: one to three Python ints ``>= 0`` (a single int is ``(x,)``), the
    missing dimensions 1. A callable grid is first called with ``arguments()``, the launch's arguments by name
    (as Triton calls it)."""
    dims = grid(arguments()) if callable(grid) else grid
    if type(dims) is tuple and 1 <= len(dims) <= 3:
        for programs in dims:
            if type(programs) is not int or not 0 <= programs <= _INT32_MAX:
                break
        else:
            return dims + _GRID_PADDING[len(dims)]
    if not isinstance(dims, (tuple, list)):
        dims = (dims,)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"grid must have 1 to 3 dimensions (a Triton launch grid), got {tuple(dims)}")
    for axis, programs in enumerate(dims):
        _python_int(f"grid[{axis}]", programs, 0, _INT32_MAX)
    return (*dims, 1, 1)[:3]


class _Launch:
    """A builder ``launch(launch_grid, *args, **kwargs)`` as SGLang's Triton kernel is called:
    ``builder[grid](...)`` calls it with the grid as ``_launch_grid`` gives it, a direct call ``builder(...)`` with
    None. Both have the signature of ``launch`` less its first parameter: SGLang's."""

    def __init__(self, launch, name):
        launch.__name__ = launch.__qualname__ = name
        self._launch = launch
        self.__signature__ = inspect.Signature(list(inspect.signature(launch).parameters.values())[1:])
        self.__name__ = self.__qualname__ = name
        self.__module__ = launch.__module__
        self.__doc__ = launch.__doc__

    def __call__(self, *args, **kwargs):
        return self._launch(None, *args, **kwargs)

    def __getitem__(self, grid):
        if not callable(grid):
            return functools.partial(self._launch, _launch_grid(grid, None))  # its signature: SGLang's

        def launch(*args, **kwargs):
            dims = _launch_grid(grid, lambda: self._arguments(args, kwargs))
            return self._launch(dims, *args, **kwargs)

        launch.__signature__, launch.__name__, launch.__doc__ = self.__signature__, self.__name__, self.__doc__
        return launch

    def _arguments(self, args, kwargs):
        """The launch's arguments by name, defaults included (what Triton passes a callable grid)."""
        bound = self.__signature__.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def __repr__(self):
        return f"<{self.__module__}.{self.__name__}>"


def _check_int(name, value, low, high):
    """``_python_int`` with its common case first."""
    if type(value) is not int or not low <= value <= high:
        _python_int(name, value, low, high)


def _check_optional_int(name, value, low, high):
    """None, or a Python int in ``[low, high]``."""
    if value is not None:
        _check_int(name, value, low, high)


def _check_stride(name, given, tensor, tensor_name):
    """``given``, SGLang's explicit row stride of ``tensor`` (the argument ``tensor_name``): None, or a Python
    int equal to ``tensor.stride(0)``."""
    if given is None or type(given) is int and type(tensor) is torch.Tensor and tensor.dim() and (
            given == tensor.stride(0)):
        return
    _python_int(name, given, 0, _EXTENT_MAX)
    _tensor(tensor_name, tensor)
    if tensor.dim() and given != tensor.stride(0):
        raise ValueError(f"{name}={given} does not match {tensor_name}'s row stride {tensor.stride(0)}; kvdispatch "
                         "reads strides from the tensors, so pass the tensor the stride belongs to")


def _as_rows(buffer, row_stride, name, stride_name, any_stride=False):
    """``buffer`` (the argument ``name``, its row stride the argument ``stride_name``) as rows: a 2-D tensor as it
    is (``row_stride`` checked against its row stride), a flat buffer as ``buffer.shape[0] // row_stride`` rows of
    ``row_stride`` entries each, row ``r`` its elements ``[r * row_stride, (r + 1) * row_stride)`` (a view: only
    elements of ``buffer``, none past it). Rows need a contiguous last dimension, so a flat buffer that is
    itself strided (``stride(0) != 1``) is refused unless its rows are of one entry.

    ``any_stride``: a 2-D tensor whose row stride is not ``row_stride`` is read as its elements in rows of
    ``row_stride`` entries, as a flat buffer is (a row of a wider layout spanning several of its rows); it must
    then be contiguous."""
    _tensor(name, buffer)
    if buffer.dim() != 1:
        if not (any_stride and buffer.dim() == 2 and type(row_stride) is int and row_stride != buffer.stride(0)):
            _check_stride(stride_name, row_stride, buffer, name)
            return buffer
        if not buffer.is_contiguous():
            raise ValueError(f"{stride_name}={row_stride} differs from {name}'s row stride {buffer.stride(0)}, so "
                             f"{name} is read as its elements in rows of {row_stride} entries, and must be "
                             f"contiguous; got shape {tuple(buffer.shape)}, strides {buffer.stride()}")
        buffer = buffer.view(-1)
    if row_stride is None:
        raise ValueError(f"a 1-D {name} needs {stride_name} (the row width)")
    _python_int(stride_name, row_stride, 1, _EXTENT_MAX)
    if row_stride > 1 and buffer.shape[0] > 1 and buffer.stride(0) != 1:
        raise ValueError(f"a flat {name} is read as rows of {stride_name}={row_stride} contiguous entries, so it "
                         f"must have stride 1, got stride {buffer.stride(0)}; pass a contiguous buffer, or a 2-D "
                         f"{name} whose rows are contiguous")
    rows = buffer.shape[0] // row_stride
    return buffer[: rows * row_stride].view(rows, row_stride)


def _leading(name, t, rows):
    """The first ``rows`` entries of the 1-D ``t`` (``t`` itself when it has exactly that many), or a ValueError
    naming it when it has fewer."""
    _tensor(name, t)
    if t.dim() != 1:
        return t  # the public call names its shape
    if t.shape[0] < rows:
        raise ValueError(f"{name} must have at least {rows} entries (the rows launched), got {t.shape[0]}")
    return t if t.shape[0] == rows else t[:rows]


from ...ops.cache_locs import create_cache_locs as _build_cache_locs  # noqa: E402

__all__ += ["_build_cache_locs"]


from ...ops.compact_csr import create_compact_kv_indices as _build_compact_csr  # noqa: E402

__all__ += ["_build_compact_csr"]

from ...ops.prefix_extend_csr import create_prefix_extend_kv_indices as _build_prefix_extend_csr  # noqa: E402

__all__ += ["_build_prefix_extend_csr"]


# The block table of a ragged token CSR (aiter_unified_page_table), looked up here at call time as the others.
from ...ops.ragged_page_table import create_ragged_page_table as _build_ragged_page_table  # noqa: E402

__all__ += ["_build_ragged_page_table"]

# The prefill-aware sliding-window token table (pa_page_table).
from ...ops.pa_swa_table import create_prefill_aware_swa_table as _build_pa_swa_table  # noqa: E402

__all__ += ["_build_pa_swa_table"]

# Two token CSRs merged row by row (extend_attention.build_unified_kv_indices).
from ...ops.merged_token_csr import create_merged_kv_indices as _build_merged_token_csr  # noqa: E402

__all__ += ["_build_merged_token_csr"]

# Each draft token's prefix-then-expand row (metadata.prepare_swa_spec_page_table_triton).
from ...ops.spec_concat_page_table import create_spec_concat_page_table as _build_spec_concat_page_table  # noqa: E402

__all__ += ["_build_spec_concat_page_table"]

from ...ops.compact_draft_rows import build_compact_draft_rows as _build_compact_draft_rows  # noqa: E402

__all__ += ["_build_compact_draft_rows"]
