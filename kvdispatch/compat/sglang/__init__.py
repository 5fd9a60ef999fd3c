"""Drop-ins for SGLang 0.5.23's KV-index builders, on kvdispatch, at SGLang's own module paths.

``kvdispatch.compat.sglang.<tail>`` mirrors ``sglang.<tail>`` for each module below, with the same names and the
same parameter names, order, defaults and keyword-only markers, so adopting it is an import swap
(``from sglang.kernels.ops.attention.kv_indices import X`` becomes ``from
kvdispatch.compat.sglang.kernels.ops.attention.kv_indices import X``); every name is also here, in
``kvdispatch.compat.sglang`` itself:

* ``kernels.ops.attention.kv_indices``: the token CSR, chunked-prefix CSR and FlashMLA block-table builders and
  the grid helpers (``spec_kv_index_token_blocks`` and ``SPEC_KV_INDEX_BLOCKS_MIN_CONTEXT`` among them);
* ``kernels.ops.attention.trtllm_mha_page_table``: the TRT-LLM MHA page table with its SWA twin;
* ``kernels.ops.attention.dcp_kernels``: one decode-context-parallel rank's token CSR and MLA block table (through
  the unified pool's ``v2p`` too), Aiter's verify ragged ids, a rank's share of a decode CSR and the prefill's CSR
  over the all-gathered prefix+extend buffer (SGLang's ``create_dcp_kv_indices``);
* ``kernels.ops.kvcache.kv_read_table``: the unified pool's read table (``build_kv_read_table``) and its packed
  token stream (``build_kv_read_table_packed``);
* ``kernels.ops.speculative.cache_locs``: the multi-step draft decode indices and their per-step window CSR;
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
the arguments by name giving one. SGLang's asserts are ValueErrors.

The one intended difference: where SGLang's kernels would step outside a request's row (a request longer than
its table row, or needing more pages than its output row holds: SGLang reads the neighbouring row of
``req_to_token`` or writes into the next output row), the row ends there; nothing is written outside the
outputs whatever ``kv_indptr`` says, and a pool index outside the table gives an empty row. Elsewhere the results
are SGLang's element for element (the block tables divide a negative slot id rounding toward zero, as SGLang's
kernels do), with lengths and start positions exact integers where SGLang's kernels keep their low 32 bits.
"""

from __future__ import annotations

import importlib
import pkgutil

# The flat namespace: every name of every mirrored module (each module's ``__all__``), found by walking this
# package, so that a new mirrored module or name needs no line here.
__all__ = []
for _module in pkgutil.walk_packages(__path__, __name__ + "."):
    if not _module.ispkg and not _module.name.rpartition(".")[2].startswith("_"):
        _mirrored = importlib.import_module(_module.name)
        globals().update({name: getattr(_mirrored, name) for name in _mirrored.__all__})
        __all__ += _mirrored.__all__
__all__.sort()
del _module, _mirrored
