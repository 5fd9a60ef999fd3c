"""Triton kernels (on the grid of ``kvdispatch.grid``) and their launchers.

``build_page_table``, ``build_token_indices``, ``build_mha_page_table``, ``build_translated_page_table``,
``build_draft_decode_indices``, ``build_dcp_token_indices`` and ``build_dcp_page_table`` (one per op) take the
arguments of ``kvdispatch.reference`` (already validated) and launch one kernel on the tensors' device and
current stream. Importing this package initialises no GPU: compilation happens at the first call per device
and specialisation.
``on_selected`` and ``on_deselected`` are the selector's hooks (``kvdispatch.dispatch``): they tell the
compiled launcher (``native.py``) which devices Triton serves.

Importing this package (or its descriptor, ``backend.py``, which ``import kvdispatch`` does) imports
neither Triton nor the kernel modules: each name below is imported from the submodule owning it at its
first access.
"""

from kvdispatch._lazy import exports

# Public name -> the submodule defining it.
_OWNERS = {
    "build_page_table": "page_table",
    "build_token_indices": "token_csr",
    "cross_compile": "crosscompile",
    "on_deselected": "native",
    "on_selected": "native",
    "reset": "launch",
    "specializations": "crosscompile",
    "build_mha_page_table": "mapped_tables",
    "build_translated_page_table": "mapped_tables",
    "build_draft_decode_indices": "draft_decode",
    "build_dcp_token_indices": "dcp",
    "build_dcp_page_table": "dcp",
}

__all__ = sorted(_OWNERS)
__getattr__, __dir__ = exports(__name__, _OWNERS)
