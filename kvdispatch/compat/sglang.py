"""SGLang compatibility: its grid-sizing helpers with identical values.

SGLang's Triton page-table kernel gives each program ``4096 // page_size`` pages, and engines size
their padded ``kv_indices`` buffers with these two functions. kvdispatch's own kernels size their grid
with ``kvdispatch.grid`` and accept any buffer width; these exist so engine code keeps its numbers.
"""

from __future__ import annotations

_SGLANG_TOKENS_PER_BLOCK = 4096


def get_num_page_per_block_flashmla(page_size: int = 64) -> int:
    """Pages per program of SGLang's page-table kernel: ``4096 // page_size``."""
    return _SGLANG_TOKENS_PER_BLOCK // page_size


def get_num_kv_index_blocks_flashmla(kv_indices_width: int, page_size: int) -> int:
    """Programs per row SGLang launches for a ``kv_indices`` buffer ``kv_indices_width`` pages wide."""
    pages = get_num_page_per_block_flashmla(page_size)
    return -(-kv_indices_width // pages)
