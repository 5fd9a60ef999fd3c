"""CUDA/HIP-portable kernels and their CuPy RawModule launchers.

``kernel(key)`` is the launcher of op ``key`` (``KERNELS``): it takes the op's parameters as its torch
reference does (``kvdispatch/ops/<key>.py``; already validated, CUDA tensors on one device) and ``pdl``, and
writes the outputs in place with one kernel launch on PyTorch's current stream. ``on_selected`` and
``on_deselected`` are the selector's hooks (``kvdispatch.dispatch``): they tell the compiled host path
(``native.py``) which devices CuPy serves.

Importing this package (or its descriptor, ``backend.py``, which ``import kvdispatch`` does) imports
neither CuPy nor the kernel modules: the builders are imported from ``launch.py`` at their first access,
and CuPy at the first launch.
"""

import sys

from kvdispatch._lazy import exports

# Op key -> (the submodule defining its launcher, the launcher's name).
KERNELS = {
    "page_table": ("launch", "build_page_table"),
    "token_csr": ("launch", "build_token_indices"),
    "mha_page_table": ("launch", "build_mha_page_table"),
    "translated_page_table": ("launch", "build_translated_page_table"),
    "draft_decode": ("launch", "build_draft_decode_indices"),
    "dcp_token_csr": ("launch", "build_dcp_token_indices"),
    "dcp_page_table": ("launch", "build_dcp_page_table"),
    "decode_metadata": ("launch", "build_decode_metadata"),
    "cache_locs": ("launch", "build_cache_locs"),
    "compact_csr": ("launch", "build_compact_kv_indices"),
    "prefix_extend_csr": ("launch", "build_prefix_extend_kv_indices"),
    "ragged_page_table": ("launch", "build_ragged_page_table"),
    "pa_swa_table": ("launch", "build_pa_swa_table"),
    "merged_token_csr": ("launch", "build_merged_kv_indices"),
    "spec_concat_page_table": ("launch", "build_spec_concat_page_table"),
    "compact_draft_rows": ("launch", "build_compact_draft_rows"),
}
# Public name -> the submodule defining it.
_OWNERS = {name: module for module, name in KERNELS.values()} | {"on_deselected": "native", "on_selected": "native"}


def kernel(key: str):
    """The launcher of op ``key`` (imported at the first access)."""
    return getattr(sys.modules[__name__], KERNELS[key][1])


__all__ = sorted(_OWNERS) + ["KERNELS", "kernel"]
__getattr__, __dir__ = exports(__name__, _OWNERS)
