"""Triton kernels (on the grid of ``kvdispatch.grid``) and their launchers.

``kernel(key)`` is the launcher of op ``key`` (``KERNELS``: the op's module and function here): it takes the
op's parameters as its torch reference does (``kvdispatch/ops/<key>.py``; already validated) and ``pdl``,
and launches one kernel on the tensors' device and current stream.
Importing this package initialises no GPU: compilation happens at the first call per device and
specialisation.
``on_selected`` and ``on_deselected`` are the selector's hooks (``kvdispatch.dispatch``): they tell the
compiled launcher (``native.py``) which devices Triton serves.

Importing this package (or its descriptor, ``backend.py``, which ``import kvdispatch`` does) imports
neither Triton nor the kernel modules: each name below is imported from the submodule owning it at its
first access.
"""

import sys

from kvdispatch._lazy import exports

# Op key -> (the submodule defining its launcher, the launcher's name).
KERNELS = {
    "page_table": ("page_table", "build_page_table"),
    "token_csr": ("token_csr", "build_token_indices"),
    "mha_page_table": ("mapped_tables", "build_mha_page_table"),
    "translated_page_table": ("mapped_tables", "build_translated_page_table"),
    "draft_decode": ("draft_decode", "build_draft_decode_indices"),
    "dcp_token_csr": ("dcp", "build_dcp_token_indices"),
    "dcp_page_table": ("dcp", "build_dcp_page_table"),
    "decode_metadata": ("decode_metadata", "build_decode_metadata"),
    "cache_locs": ("cache_locs", "build_cache_locs"),
    "compact_csr": ("compact_csr", "build_compact_kv_indices"),
    "prefix_extend_csr": ("prefix_extend_csr", "build_prefix_extend_kv_indices"),
    "ragged_page_table": ("ragged_page_table", "build_ragged_page_table"),
    "pa_swa_table": ("pa_swa_table", "build_pa_swa_table"),
    "merged_token_csr": ("merged_token_csr", "build_merged_kv_indices"),
    "spec_concat_page_table": ("spec_concat_page_table", "build_spec_concat_page_table"),
    "compact_draft_rows": ("compact_draft_rows", "build_compact_draft_rows"),
}
# Public name -> the submodule defining it.
_OWNERS = {name: module for module, name in KERNELS.values()} | {
    "cross_compile": "crosscompile",
    "on_deselected": "native",
    "on_selected": "native",
    "reset": "launch",
    "specializations": "crosscompile",
}


def kernel(key: str):
    """The launcher of op ``key`` (imported at the first access)."""
    return getattr(sys.modules[__name__], KERNELS[key][1])


__all__ = sorted(_OWNERS) + ["KERNELS", "kernel"]
__getattr__, __dir__ = exports(__name__, _OWNERS)
