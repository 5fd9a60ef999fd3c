"""CUDA/HIP-portable kernels and their CuPy RawModule launchers.

``build_page_table`` / ``build_token_indices`` take ``kvdispatch.reference``'s positional arguments
(already validated, CUDA tensors on one device) and write ``out`` in place with one kernel launch on
PyTorch's current stream. ``on_selected`` and ``on_deselected`` are the selector's hooks
(``kvdispatch.dispatch``): they tell the compiled host path (``native.py``) which devices CuPy serves.

Importing this package (or its descriptor, ``backend.py``, which ``import kvdispatch`` does) imports
neither CuPy nor the kernel modules: the builders are imported from ``launch.py`` at their first access,
and CuPy at the first launch.
"""

from kvdispatch._lazy import exports

# Public name -> the submodule defining it.
_OWNERS = {
    "build_page_table": "launch",
    "build_token_indices": "launch",
    "build_mha_page_table": "launch",
    "build_translated_page_table": "launch",
    "build_draft_decode_indices": "launch",
    "build_dcp_token_indices": "launch",
    "build_dcp_page_table": "launch",
    "on_deselected": "native",
    "on_selected": "native",
}

__all__ = sorted(_OWNERS)
__getattr__, __dir__ = exports(__name__, _OWNERS)
