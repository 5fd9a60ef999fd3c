"""The public builders as PyTorch custom ops: ``torch.ops.kvdispatch.<public name>``.

``torch.compile`` cannot trace into a backend (the compiled C launcher, CuPy, Triton's Python launcher), so
while tracing, the public functions call these ops instead (``kvdispatch.api``): the graph holds one opaque
op per call, its declared mutated outputs (``out``, ``seq_lens_out``) let AOTAutograd functionalise it and
Inductor write in place, and Inductor's CUDA graphs (``mode="reduce-overhead"``) capture the launch.

Each op takes the public function's arguments, with the same keyword options, plus ``backend`` as a string
and ``enable_pdl`` (None: ``KVDISPATCH_PDL`` when the op runs); it mutates its outputs and returns nothing
(``PAGE_TABLE_SCHEMA``, ``TOKEN_CSR_SCHEMA``).

* Real kernel, on every device: the eager call with ``backend=<the op's backend>``, i.e. its checks, its
  dispatch and its compiled fast path. (An eager call routes to the op only while
  ``torch.compiler.is_compiling()``; a kernel runs when a compiled graph runs, after its compilation.)
* Fake kernel: the same argument checks on the tensors' metadata, so a bad argument fails at trace time
  with the eager error. The integer and flag options are ``Scalar`` in the schema (``Scalar?`` where None is
  allowed), so that the kernel and the fake see the caller's object and refuse what the public functions
  refuse: the ``int`` and ``bool`` types would convert it first (``True`` to 1, None to False, 0.5 to True).
  Python ints and bools pass through unchanged; Dynamo specialises on their values, and a new value traces
  again, as a new page size compiles a new Triton kernel.
* ``backend`` is the backend *request*, fixed when the graph is traced: ``backend=`` if given, else
  ``KVDISPATCH_BACKEND`` as read then, else ``"auto"`` (which selects at the op's first run per device, as
  eager calls do). Dynamo guards on ``backend=`` and on ``dispatch.generation``, which ``kvdispatch.reset()``
  bumps: after a reset (how a changed ``KVDISPATCH_BACKEND`` takes effect, eager or compiled) a compiled
  function traces again instead of reusing its graph.

Registration defines the schemas and registers Python kernels; no device is touched at import.
"""

from __future__ import annotations

import functools

import torch

from . import api
from ._validate import (check_dcp_page_table_args, check_dcp_token_csr_args, check_draft_decode_args, check_flag,
                        check_mha_page_table_args, check_page_table_args, check_token_csr_args,
                        check_translated_page_table_args)

NAMESPACE = "kvdispatch"
PAGE_TABLE_SCHEMA = (
    "create_flashmla_kv_indices(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, Tensor(a!) out, *, "
    "Scalar page_size, Tensor? kv_start_idx=None, Scalar seqlen_offset=0, Tensor(b!)? seq_lens_out=None, "
    "Scalar? fill_value=None, Scalar round_toward_zero=False, str backend=\"auto\", Scalar? enable_pdl=None) -> ()")
TOKEN_CSR_SCHEMA = (
    "create_flashinfer_kv_indices(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, Tensor kv_indptr, "
    "Tensor(a!) out, *, Tensor? kv_start_idx=None, Scalar entry_page_size=1, Tensor? token_mapping=None, "
    "str backend=\"auto\", Scalar? enable_pdl=None) -> ()")
MHA_PAGE_TABLE_SCHEMA = (
    "create_trtllm_mha_page_table(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
    "Tensor(a!) page_table, *, Scalar page_size, Tensor(b!)? swa_page_table=None, Tensor? full_to_swa=None, "
    "Scalar round_toward_zero=False, str backend=\"auto\", Scalar? enable_pdl=None) -> ()")
TRANSLATED_PAGE_TABLE_SCHEMA = (
    "create_translated_page_table(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, Tensor v2p, "
    "Tensor(a!) out, *, Scalar page_size, Scalar multiplier=1, Scalar? max_pages=None, Scalar seq_len_delta=0, "
    "str backend=\"auto\", Scalar? enable_pdl=None) -> ()")
DRAFT_DECODE_SCHEMA = (
    "create_draft_decode_kv_indices(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
    "Tensor(a!) kv_indptr, Tensor(b!) out, *, Scalar num_steps, Scalar topk, Scalar page_size=1, "
    "Tensor? positions=None, Scalar window_size=0, Scalar sink_size=0, Tensor? v2p=None, "
    "Scalar write_indptr_start=True, Scalar round_toward_zero=False, str backend=\"auto\", "
    "Scalar? enable_pdl=None) -> ()")

DCP_TOKEN_CSR_SCHEMA = (
    "create_dcp_kv_indices(Tensor req_to_token, Tensor req_pool_indices, Tensor local_seq_lens, Tensor kv_indptr, "
    "Tensor(a!) out, *, Scalar dcp_size, Scalar dcp_rank, Tensor? kv_start_idx=None, "
    "Scalar round_toward_zero=False, str backend=\"auto\", Scalar? enable_pdl=None) -> ()")
DCP_PAGE_TABLE_SCHEMA = (
    "create_dcp_page_table(Tensor req_to_token, Tensor req_pool_indices, Tensor local_seq_lens, Tensor(a!) out, *, "
    "Scalar page_size, Scalar dcp_size, Scalar dcp_rank, Scalar? fill_value=None, Scalar round_toward_zero=False, "
    "str backend=\"auto\", Scalar? enable_pdl=None) -> ()")

# Kept alive for the life of the process: dropping a Library removes its ops.
_library = torch.library.Library(NAMESPACE, "FRAGMENT")


def _page_table_kernel(req_to_token, req_pool_indices, seq_lens, out, *, page_size, kv_start_idx=None,
                       seqlen_offset=0, seq_lens_out=None, fill_value=None, round_toward_zero=False,
                       backend="auto", enable_pdl=None):
    """The page-table op on real tensors: the eager call, which fills ``out`` (and ``seq_lens_out``)."""
    api.create_flashmla_kv_indices(req_to_token, req_pool_indices, seq_lens, out, page_size=page_size,
                                   kv_start_idx=kv_start_idx, seqlen_offset=seqlen_offset,
                                   seq_lens_out=seq_lens_out, fill_value=fill_value,
                                   round_toward_zero=round_toward_zero, backend=backend, enable_pdl=enable_pdl)


def _token_csr_kernel(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, *, kv_start_idx=None,
                      entry_page_size=1, token_mapping=None, backend="auto", enable_pdl=None):
    """The token-CSR op on real tensors: the eager call, which fills ``out``."""
    api.create_flashinfer_kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out,
                                     kv_start_idx=kv_start_idx, entry_page_size=entry_page_size,
                                     token_mapping=token_mapping, backend=backend, enable_pdl=enable_pdl)


def _page_table_fake(req_to_token, req_pool_indices, seq_lens, out, *, page_size, kv_start_idx=None,
                     seqlen_offset=0, seq_lens_out=None, fill_value=None, round_toward_zero=False, backend="auto",
                     enable_pdl=None):
    """Metadata only: the argument checks that need no memory; nothing to allocate (the op returns nothing)."""
    check_page_table_args(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx, seqlen_offset,
                          seq_lens_out, fill_value, round_toward_zero, memory=False)


def _token_csr_fake(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, *, kv_start_idx=None,
                    entry_page_size=1, token_mapping=None, backend="auto", enable_pdl=None):
    """Metadata only: the argument checks that need no memory."""
    check_token_csr_args(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx, entry_page_size,
                         token_mapping, memory=False)


def _mha_page_table_kernel(req_to_token, req_pool_indices, seq_lens, page_table, *, page_size, swa_page_table=None,
                           full_to_swa=None, round_toward_zero=False, backend="auto", enable_pdl=None):
    """The TRT-LLM MHA page-table op on real tensors: the eager call."""
    api.create_trtllm_mha_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size=page_size,
                                     swa_page_table=swa_page_table, full_to_swa=full_to_swa,
                                     round_toward_zero=round_toward_zero, backend=backend, enable_pdl=enable_pdl)


def _mha_page_table_fake(req_to_token, req_pool_indices, seq_lens, page_table, *, page_size, swa_page_table=None,
                         full_to_swa=None, round_toward_zero=False, backend="auto", enable_pdl=None):
    """Metadata only: the argument checks that need no memory."""
    check_mha_page_table_args(req_to_token, req_pool_indices, seq_lens, page_table, page_size, swa_page_table,
                              full_to_swa, round_toward_zero, memory=False)


def _translated_page_table_kernel(req_to_token, req_pool_indices, seq_lens, v2p, out, *, page_size, multiplier=1,
                                  max_pages=None, seq_len_delta=0, backend="auto", enable_pdl=None):
    """The translated page-table op on real tensors: the eager call."""
    api.create_translated_page_table(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size=page_size,
                                     multiplier=multiplier, max_pages=max_pages, seq_len_delta=seq_len_delta,
                                     backend=backend, enable_pdl=enable_pdl)


def _translated_page_table_fake(req_to_token, req_pool_indices, seq_lens, v2p, out, *, page_size, multiplier=1,
                                max_pages=None, seq_len_delta=0, backend="auto", enable_pdl=None):
    """Metadata only: the argument checks that need no memory."""
    check_translated_page_table_args(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier,
                                     max_pages, seq_len_delta, memory=False)


def _draft_decode_kernel(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, *, num_steps, topk, page_size=1,
                         positions=None, window_size=0, sink_size=0, v2p=None, write_indptr_start=True,
                         round_toward_zero=False, backend="auto", enable_pdl=None):
    """The draft-decode op on real tensors: the eager call, which fills ``out`` and ``kv_indptr``."""
    api.create_draft_decode_kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out,
                                       num_steps=num_steps, topk=topk, page_size=page_size, positions=positions,
                                       window_size=window_size, sink_size=sink_size, v2p=v2p,
                                       write_indptr_start=write_indptr_start, round_toward_zero=round_toward_zero,
                                       backend=backend, enable_pdl=enable_pdl)


def _draft_decode_fake(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, *, num_steps, topk, page_size=1,
                       positions=None, window_size=0, sink_size=0, v2p=None, write_indptr_start=True,
                       round_toward_zero=False, backend="auto", enable_pdl=None):
    """Metadata only: the argument checks that need no memory."""
    check_draft_decode_args(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps, topk, page_size,
                            positions, window_size, sink_size, v2p, write_indptr_start, round_toward_zero,
                            memory=False)


def _dcp_token_csr_fake(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, *, dcp_size, dcp_rank,
                        kv_start_idx=None, round_toward_zero=False, backend="auto", enable_pdl=None):
    """Metadata only: the argument checks that need no memory."""
    check_dcp_token_csr_args(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, kv_start_idx, dcp_size,
                             dcp_rank, round_toward_zero, memory=False)


def _dcp_page_table_fake(req_to_token, req_pool_indices, local_seq_lens, out, *, page_size, dcp_size, dcp_rank,
                         fill_value=None, round_toward_zero=False, backend="auto", enable_pdl=None):
    """Metadata only: the argument checks that need no memory."""
    check_dcp_page_table_args(req_to_token, req_pool_indices, local_seq_lens, out, page_size, dcp_size, dcp_rank,
                              fill_value, round_toward_zero, memory=False)


def _dcp_token_csr_kernel(*args, **kwargs):
    """The DCP token-CSR op on real tensors: the eager call (the schema's arguments are its own)."""
    api.create_dcp_kv_indices(*args, **kwargs)


def _dcp_page_table_kernel(*args, **kwargs):
    """The DCP page-table op on real tensors: the eager call (the schema's arguments are its own)."""
    api.create_dcp_page_table(*args, **kwargs)


def _registered_fake(fake):
    """What is registered as the fake of ``fake``: ``enable_pdl`` checked (the public function checks it, its
    argument checks do not), and each option Dynamo made symbolic (a ``SymInt`` where the caller passed an int
    that changed between calls) taken as its value, guarded on: a new value traces again, as with an ``int``
    schema type, and the checks see the Python int the real kernel will get."""
    @functools.wraps(fake)
    def checked(*tensors, enable_pdl=None, **options):
        check_flag("enable_pdl", enable_pdl, optional=True)
        fake(*tensors, **{name: int(value) if isinstance(value, torch.SymInt) else value
                          for name, value in options.items()}, enable_pdl=enable_pdl)
    return checked


for _schema, _kernel, _fake in ((PAGE_TABLE_SCHEMA, _page_table_kernel, _page_table_fake),
                                (TOKEN_CSR_SCHEMA, _token_csr_kernel, _token_csr_fake),
                                (MHA_PAGE_TABLE_SCHEMA, _mha_page_table_kernel, _mha_page_table_fake),
                                (TRANSLATED_PAGE_TABLE_SCHEMA, _translated_page_table_kernel,
                                 _translated_page_table_fake),
                                (DRAFT_DECODE_SCHEMA, _draft_decode_kernel, _draft_decode_fake),
                                (DCP_TOKEN_CSR_SCHEMA, _dcp_token_csr_kernel, _dcp_token_csr_fake),
                                (DCP_PAGE_TABLE_SCHEMA, _dcp_page_table_kernel, _dcp_page_table_fake)):
    _name = _schema[: _schema.index("(")]
    _library.define(_schema)
    _library.impl(_name, _kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{_name}", _registered_fake(_fake), lib=_library)
