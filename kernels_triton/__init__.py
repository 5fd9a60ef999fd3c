"""Triton kernels (on the grid of ``kvdispatch.grid``) and their launchers.

``build_page_table`` and ``build_token_indices`` take the arguments of ``kvdispatch.reference`` (already
validated) and launch one kernel on the tensors' device and current stream. Importing this package
initialises no GPU: compilation happens at the first call per device and specialisation.
``on_selected`` and ``on_deselected`` are the selector's hooks (``kvdispatch.dispatch``): they tell the
compiled launcher (``native.py``) which devices Triton serves.
"""

from .crosscompile import cross_compile, specializations
from .launch import reset
from .native import on_deselected, on_selected
from .page_table import build_page_table
from .token_csr import build_token_indices

__all__ = ["build_page_table", "build_token_indices", "cross_compile", "on_deselected", "on_selected", "reset",
           "specializations"]
