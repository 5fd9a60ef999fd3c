"""Triton kernels (2-D grid) and their launchers.

``build_page_table`` and ``build_token_indices`` take the arguments of ``kvdispatch.reference`` (already
validated) and launch one kernel on the tensors' device and current stream. Importing this package
initialises no GPU: compilation happens at the first call per device and specialisation.
"""

from .crosscompile import cross_compile, specializations
from .launch import reset
from .page_table import build_page_table
from .token_csr import build_token_indices

__all__ = ["build_page_table", "build_token_indices", "cross_compile", "reset", "specializations"]
