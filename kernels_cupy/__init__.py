"""CUDA/HIP-portable kernels and their CuPy RawModule launchers.

``build_page_table`` / ``build_token_indices`` take ``kvdispatch.reference``'s positional arguments
(already validated, CUDA tensors on one device) and write ``out`` in place with one kernel launch on
PyTorch's current stream. CuPy is imported on the first call, not here.
"""

from __future__ import annotations

from .launch import page_table_call, token_csr_call

_runtime_module = None


def _runtime():
    """``kernels_cupy.runtime`` (which imports CuPy), imported at the first launch and then kept:
    an import statement costs host time on every call."""
    global _runtime_module
    if _runtime_module is None:
        from . import runtime

        _runtime_module = runtime
    return _runtime_module


def build_page_table(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx=None,
                     seqlen_offset=0, seq_lens_out=None, fill_value=None):
    """Paged block table; semantics of ``kvdispatch.create_flashmla_kv_indices``. Returns ``out``."""
    call = page_table_call(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx,
                           seqlen_offset, seq_lens_out, fill_value)
    if call is not None:
        _runtime().launch(call, req_to_token.device)
    return out


def build_token_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx=None,
                        entry_page_size=1, token_mapping=None):
    """Token-level CSR indices; semantics of ``kvdispatch.create_flashinfer_kv_indices``. Returns ``out``."""
    call = token_csr_call(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx, entry_page_size,
                          token_mapping)
    if call is not None:
        _runtime().launch(call, req_to_token.device)
    return out
