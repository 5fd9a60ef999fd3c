"""Drop-ins for SGLang 0.5.23's KV-index builders, on kvdispatch, at SGLang's own module paths.

``kvdispatch.compat.sglang.<tail>`` mirrors ``sglang.<tail>`` for each module below, with the same names and the
same parameter names, order, defaults and keyword-only markers, so adopting it is an import swap
(``from sglang.kernels.ops.attention.kv_indices import X`` becomes ``from
kvdispatch.compat.sglang.kernels.ops.attention.kv_indices import X``); every name is also here, in
``kvdispatch.compat.sglang`` itself:

* ``kernels.ops.attention.kv_indices``: the token CSR, chunked-prefix CSR and FlashMLA block-table builders and
  the grid helpers (``spec_kv_index_token_blocks`` and ``SPEC_KV_INDEX_BLOCKS_MIN_CONTEXT`` among them);
* ``kernels.ops.attention.trtllm_mha_page_table``: the TRT-LLM MHA page table with its SWA twin;
* ``kernels.ops.attention.dcp_kernels``: one decode-context-parallel rank's token CSR and MLA block table;
* ``kernels.ops.kvcache.kv_read_table``: the unified pool's read table (``build_kv_read_table``);
* ``kernels.ops.speculative.cache_locs``: the multi-step draft decode indices;
* ``srt.layers.dcp.layout``: ``get_dcp_lens``; ``srt.speculative.spec_utils``: the draft buffer sizing helpers.

Builders SGLang calls as Triton kernels are called the same way, ``builder[grid](...)``, or directly. The row
strides SGLang passes explicitly (``req_to_token_ptr_stride``, ``kv_indices_ptr_stride``, ...) are redundant,
since tensors carry their strides: they are checked against the tensors, and a mismatch is a ``ValueError`` (in
SGLang's kernel it would be a silent read or write in the wrong place). A flat (1-D) table buffer is read as rows
of its row-stride argument's entries: a view of that buffer, row ``r`` its elements ``[r * stride, (r + 1) *
stride)``, never an element past it. Rows need a contiguous last dimension, so a flat buffer that is itself
strided (``big[::2]``) cannot be read as rows wider than one entry and is refused with a ``ValueError``.

Arguments are checked as the public functions check theirs, before anything is written: counts, sizes, ranks,
strides and grid entries are Python ints (never bool or float) in range, flags are bools; anything else is a
``TypeError`` / ``ValueError`` naming the argument (errors from the forwarded call name the public function's
parameters: ``out``, ``seq_lens``, ...). A grid is a Triton grid: one to three ints ``>= 0``, or a callable of
the arguments by name giving one. SGLang's asserts are ValueErrors. Options kvdispatch does not implement raise
``NotImplementedError`` naming them (``ENTRY_PAGE_SIZE > 1`` of the draft builder, ``HAS_V2P`` of the DCP block
table, ``zero_tail`` of the read table).

The one intended difference: where SGLang's kernels would step outside a request's row (a request longer than
its table row, or needing more pages than its output row holds: SGLang reads the neighbouring row of
``req_to_token`` or writes into the next output row), the row ends there; nothing is written outside the
outputs whatever ``kv_indptr`` says, and a pool index outside the table gives an empty row. Elsewhere the results
are SGLang's element for element (the block tables divide a negative slot id rounding toward zero, as SGLang's
kernels do), with lengths and start positions exact integers where SGLang's kernels keep their low 32 bits.
"""

from __future__ import annotations

from .kernels.ops.attention.dcp_kernels import create_mla_kv_page_table_for_dcp, create_triton_kv_indices_for_dcp_triton
from .kernels.ops.attention.kv_indices import (SPEC_KV_INDEX_BLOCKS_MIN_CONTEXT, create_chunked_prefix_cache_kv_indices,
                                               create_flashinfer_kv_indices_triton, create_flashmla_kv_indices_triton,
                                               get_num_kv_index_blocks_flashmla, get_num_page_per_block_flashmla,
                                               kv_indices_num_token_blocks, spec_kv_index_token_blocks)
from .kernels.ops.attention.trtllm_mha_page_table import (build_trtllm_mha_page_table,
                                                          create_trtllm_mha_kv_indices_triton,
                                                          get_num_mha_kv_index_blocks)
from .kernels.ops.kvcache.kv_read_table import build_kv_read_table
from .kernels.ops.speculative.cache_locs import generate_draft_decode_kv_indices
from .srt.layers.dcp.layout import get_dcp_lens
from .srt.speculative.spec_utils import draft_kv_indices_buffer_width, draft_kv_indices_used_len

__all__ = [
    "SPEC_KV_INDEX_BLOCKS_MIN_CONTEXT",
    "build_kv_read_table",
    "build_trtllm_mha_page_table",
    "create_chunked_prefix_cache_kv_indices",
    "create_flashinfer_kv_indices_triton",
    "create_flashmla_kv_indices_triton",
    "create_mla_kv_page_table_for_dcp",
    "create_triton_kv_indices_for_dcp_triton",
    "create_trtllm_mha_kv_indices_triton",
    "draft_kv_indices_buffer_width",
    "draft_kv_indices_used_len",
    "generate_draft_decode_kv_indices",
    "get_dcp_lens",
    "get_num_kv_index_blocks_flashmla",
    "get_num_mha_kv_index_blocks",
    "get_num_page_per_block_flashmla",
    "kv_indices_num_token_blocks",
    "spec_kv_index_token_blocks",
]

from .kernels.ops.attention.metadata import draft_extend_set_metadata, normal_decode_set_metadata  # noqa: E402
from .kernels.ops.attention.trtllm_mha_graph_metadata import update_trtllm_mha_graph_metadata  # noqa: E402

__all__ += ["draft_extend_set_metadata", "normal_decode_set_metadata", "update_trtllm_mha_graph_metadata"]
from .kernels.ops.speculative.cache_locs import (assign_draft_cache_locs_contiguous_func,  # noqa: E402
                                                 assign_extend_cache_locs_func, assign_extend_cache_locs_uniform_func,
                                                 fill_front_out_cache_loc_func)

__all__ += ["assign_draft_cache_locs_contiguous_func", "assign_extend_cache_locs_func",
            "assign_extend_cache_locs_uniform_func", "fill_front_out_cache_loc_func"]
from .kernels.ops.speculative.cache_locs import rebuild_compact_draft_req_to_token_func  # noqa: E402

__all__ += ["rebuild_compact_draft_req_to_token_func"]
