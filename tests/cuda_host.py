"""kv_indices.cu built for the host with g++ (through cuda_host_shim.h) and run on CPU tensors.

This is how CI without a GPU tests the CUDA/HIP source itself: the same kernels, the same launch
geometry and arguments as the CuPy launcher (``kernels_cupy.launch``), every thread run in turn. The grid is
the launcher's, bounded by the program budget of the CPU's probe (``kvdispatch.grid.program_budget``), so the
kernels' programs stride over their rows' blocks as on a GPU.
The shared library is built once per source hash (and ``$CUDA_HOST_CXXFLAGS``, more compiler options) into the
``cuda-host`` directory of the build cache (``kvdispatch._build_cache``: private to the current user, refused
otherwise) and loaded with ctypes. The ``cupy-host`` CI lane builds it under AddressSanitizer, so that every
access of a kernel outside an allocation stops the run.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import inspect
import os
import shutil
import subprocess
from pathlib import Path

from kernels_cupy import KERNELS, build
from kernels_cupy.launch import (KernelCall, dcp_page_table_call, dcp_token_csr_call, draft_decode_call,
                                 mha_page_table_call, page_table_call, token_csr_call, translated_page_table_call)
from kvdispatch import _build_cache
from kvdispatch import ops

SHIM_PATH = Path(__file__).with_name("cuda_host_shim.h")
# More compiler options for the host build, e.g. AddressSanitizer's (the cupy-host lane); part of the build's key.
EXTRA_FLAGS_ENV = "CUDA_HOST_CXXFLAGS"


def build_dir() -> Path:
    """The private directory the host builds live in (created 0700 where missing)."""
    return _build_cache.private_dir(_build_cache.root() / "cuda-host")


@functools.lru_cache(maxsize=None)
def library(defines: tuple = (), kernels: tuple = tuple(build.KERNELS)) -> ctypes.CDLL:
    """Build (if needed) and load the host library of ``kernels``; one build per content of the source and the
    shim, per specialisation ``defines`` (``KernelCall.defines``; none: the generic kernels) and per kernel list.
    The shim makes every kernel an inline function, so a build compiles only the kernels it exports: a
    specialisation, built for one kernel, takes about 0.4 s instead of 1.1."""
    unit = ("".join(f"#define {name} {value}\n" for name, value in defines)
            + f'#include "{SHIM_PATH}"\n#include "{build.SOURCE_PATH}"\n'
            + "".join(f"KV_HOST_EXPORT({name})\n" for name in kernels))
    extra_flags = os.environ.get(EXTRA_FLAGS_ENV, "").split()
    digest = hashlib.sha256((unit + build.source() + SHIM_PATH.read_text() + " ".join(extra_flags)).encode()
                            ).hexdigest()[:16]
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("the host build of kv_indices.cu needs a C++ compiler (g++ or $CXX)")

    def compile_to(partial: Path) -> None:
        done = subprocess.run([compiler, "-x", "c++", build.STD_FLAG, "-O2", *extra_flags, "-shared", "-fPIC",
                               "-Wall", "-Wno-unknown-pragmas", "-o", str(partial), "-"], input=unit,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"host build of kv_indices.cu failed:\n{done.stdout}{done.stderr}")

    lib = ctypes.CDLL(str(_build_cache.build(build_dir(), f"kv_indices_{digest}.so", compile_to)))
    for name in kernels:
        getattr(lib, f"host_{name}").argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                                 ctypes.POINTER(ctypes.c_void_p)]
    return lib


def run(call: KernelCall | None, specialised: bool = False) -> None:
    """Run one kernel call on the host (the tensors behind its pointers must be CPU tensors), through the
    generic library or, with ``specialised``, the one built for the call's specialisation as on a GPU."""
    if call is None:
        return
    values = [ctypes.c_uint64(a & 0xFFFF_FFFF_FFFF_FFFF) for a in call.args]  # every parameter is 8 bytes
    pointers = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
    lib = library(call.defines, (call.kernel,)) if specialised else library()
    getattr(lib, f"host_{call.kernel}")(*call.grid, call.threads, pointers)


def build_page_table(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx=None, seqlen_offset=0,
                     seq_lens_out=None, fill_value=None, round_toward_zero=False, specialised=False):
    """The CuPy backend's ``build_page_table`` (validated arguments, CPU tensors) through the host build of the
    kernel (``specialised``: the build for this call's page size and flags, as the GPU launcher compiles)."""
    _require_cpu(req_to_token)
    run(page_table_call(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx, seqlen_offset,
                        seq_lens_out, fill_value, round_toward_zero), specialised)
    return out


def build_token_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx=None,
                        entry_page_size=1, token_mapping=None, v2p=None, page_size=1, specialised=False):
    """The CuPy backend's ``build_token_indices`` through the host build (as ``build_page_table``)."""
    _require_cpu(req_to_token)
    run(token_csr_call(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx, entry_page_size,
                       token_mapping, v2p, page_size), specialised)
    return out


def create_flashmla_kv_indices(req_to_token, req_pool_indices, seq_lens, out, *, page_size, kv_start_idx=None,
                               seqlen_offset=0, seq_lens_out=None, fill_value=None, round_toward_zero=False,
                               specialised=False):
    """``kvdispatch.create_flashmla_kv_indices`` on CPU tensors, through the host build of the kernel."""
    ops.page_table.check_arguments(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx,
                                   seqlen_offset, seq_lens_out, fill_value, round_toward_zero)
    return build_page_table(req_to_token, req_pool_indices, seq_lens, out, page_size, kv_start_idx, seqlen_offset,
                            seq_lens_out, fill_value, round_toward_zero, specialised)


def create_flashinfer_kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, *, kv_start_idx=None,
                                 entry_page_size=1, token_mapping=None, v2p=None, page_size=1, specialised=False):
    """``kvdispatch.create_flashinfer_kv_indices`` on CPU tensors, through the host build of the kernel."""
    ops.token_csr.check_arguments(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx,
                                  entry_page_size, token_mapping, v2p, page_size)
    return build_token_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, kv_start_idx,
                               entry_page_size, token_mapping, v2p, page_size, specialised)


def build_mha_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, swa_page_table=None,
                         full_to_swa=None, round_toward_zero=False, seqlen_offset=0, specialised=False):
    """The CuPy backend's ``build_mha_page_table`` through the host build (as ``build_page_table``)."""
    _require_cpu(req_to_token)
    run(mha_page_table_call(req_to_token, req_pool_indices, seq_lens, page_table, page_size, swa_page_table,
                            full_to_swa, round_toward_zero, seqlen_offset), specialised)
    return page_table


def build_translated_page_table(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier=1,
                                max_pages=None, seq_len_delta=0, fill_value=None, specialised=False):
    """The CuPy backend's ``build_translated_page_table`` through the host build (as ``build_page_table``)."""
    _require_cpu(req_to_token)
    run(translated_page_table_call(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier,
                                   max_pages, seq_len_delta, fill_value), specialised)
    return out


def create_trtllm_mha_page_table(req_to_token, req_pool_indices, seq_lens, page_table, *, page_size,
                                 swa_page_table=None, full_to_swa=None, round_toward_zero=False, seqlen_offset=0,
                                 specialised=False):
    """``kvdispatch.create_trtllm_mha_page_table`` on CPU tensors, through the host build of the kernel."""
    ops.mha_page_table.check_arguments(req_to_token, req_pool_indices, seq_lens, page_table, page_size, swa_page_table,
                              full_to_swa, round_toward_zero, seqlen_offset)
    return build_mha_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, swa_page_table,
                                full_to_swa, round_toward_zero, seqlen_offset, specialised)


def create_translated_page_table(req_to_token, req_pool_indices, seq_lens, v2p, out, *, page_size, multiplier=1,
                                 max_pages=None, seq_len_delta=0, fill_value=None, specialised=False):
    """``kvdispatch.create_translated_page_table`` on CPU tensors, through the host build of the kernel."""
    ops.translated_page_table.check_arguments(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier,
                                     max_pages, seq_len_delta, fill_value)
    return build_translated_page_table(req_to_token, req_pool_indices, seq_lens, v2p, out, page_size, multiplier,
                                       max_pages, seq_len_delta, fill_value, specialised)


def create_draft_decode_kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, out, *, num_steps, topk,
                                   page_size=1, positions=None, window_size=0, sink_size=0, v2p=None,
                                   write_indptr_start=True, round_toward_zero=False, entry_page_size=1,
                                   step_window=0, specialised=False):
    """``kvdispatch.create_draft_decode_kv_indices`` on CPU tensors, through the host build of the kernel."""
    args = (req_to_token, req_pool_indices, seq_lens, kv_indptr, out, num_steps, topk, page_size, positions,
            window_size, sink_size, v2p, write_indptr_start, round_toward_zero, entry_page_size, step_window)
    ops.draft_decode.check_arguments(*args)
    _require_cpu(req_to_token)
    run(draft_decode_call(*args), specialised)
    return out


def _require_cpu(tensor):
    if tensor.device.type != "cpu":
        raise ValueError(f"the host build runs on CPU tensors only, got {tensor.device}")


def create_dcp_kv_indices(req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out, *, dcp_size, dcp_rank,
                          kv_start_idx=None, round_toward_zero=False, specialised=False):
    """``kvdispatch.create_dcp_kv_indices`` on CPU tensors, through the host build of the kernel."""
    arguments = (req_to_token, req_pool_indices, local_seq_lens, kv_indptr, out)
    options = dict(dcp_size=dcp_size, dcp_rank=dcp_rank, kv_start_idx=kv_start_idx, round_toward_zero=round_toward_zero)
    return _checked_run(ops.dcp_token_csr.check_arguments, dcp_token_csr_call, arguments, options, specialised)


def create_dcp_page_table(req_to_token, req_pool_indices, local_seq_lens, out, *, page_size, dcp_size, dcp_rank,
                          fill_value=None, round_toward_zero=False, v2p=None, specialised=False):
    """``kvdispatch.create_dcp_page_table`` on CPU tensors, through the host build of the kernel."""
    arguments = (req_to_token, req_pool_indices, local_seq_lens, out)
    options = dict(page_size=page_size, dcp_size=dcp_size, dcp_rank=dcp_rank, fill_value=fill_value,
                   round_toward_zero=round_toward_zero, v2p=v2p)
    return _checked_run(ops.dcp_page_table.check_arguments, dcp_page_table_call, arguments, options, specialised)


def _checked_run(check, make_call, arguments, options, specialised):
    """Validate with ``check`` and run the ``KernelCall`` of ``make_call`` (both take ``arguments`` then
    ``options`` by name) on the host; returns ``out``, the last of ``arguments``."""
    check(*arguments, **options)
    _require_cpu(arguments[0])
    run(make_call(*arguments, **options), specialised)
    return arguments[-1]


def kernel(key):
    """The host build's launcher of op ``key``, by the CuPy backend's names (``kernels_cupy.KERNELS``);
    AttributeError for an op it has no launcher of."""
    name = KERNELS[key][1]
    if name not in globals():
        raise AttributeError(f"the host build has no {name}")
    return globals()[name]


from kernels_cupy.launch import decode_metadata_call  # noqa: E402


def build_decode_metadata(*args, pdl=False):
    """The CuPy backend's ``build_decode_metadata`` through the host build (as ``build_page_table``)."""
    run(decode_metadata_call(*args))
    return args[3]


def update_decode_metadata(*args, specialised=False, **options):
    """``kvdispatch.update_decode_metadata`` on CPU tensors, through the host build of the kernel."""
    bound = inspect.signature(ops.decode_metadata.update_decode_metadata).bind(*args, **options)
    bound.apply_defaults()
    arguments = {name: value for name, value in bound.arguments.items() if name not in ("backend", "enable_pdl")}
    ops.decode_metadata.check_arguments(**arguments)
    _require_cpu(arguments["req_to_token"])
    run(decode_metadata_call(**arguments), specialised)
    return arguments["cache_seqlens"]
from kernels_cupy.launch import cache_locs_call  # noqa: E402


def build_cache_locs(req_to_token, req_pool_indices, start_offset, out, end_offset=None, width=None,
                     positions_out=None, page_size=1, full_v2p=None, full_out=None, swa_v2p=None, swa_out=None,
                     specialised=False):
    """The CuPy backend's ``build_cache_locs`` through the host build (as ``build_page_table``)."""
    _require_cpu(req_to_token)
    run(cache_locs_call(req_to_token, req_pool_indices, start_offset, out, end_offset, width, positions_out,
                        page_size, full_v2p, full_out, swa_v2p, swa_out), specialised)
    return out


def create_cache_locs(req_to_token, req_pool_indices, start_offset, out, *, end_offset=None, width=None,
                      positions_out=None, page_size=1, full_v2p=None, full_out=None, swa_v2p=None, swa_out=None,
                      specialised=False):
    """``kvdispatch.create_cache_locs`` on CPU tensors, through the host build of the kernel."""
    arguments = (req_to_token, req_pool_indices, start_offset, out)
    options = dict(end_offset=end_offset, width=width, positions_out=positions_out, page_size=page_size,
                   full_v2p=full_v2p, full_out=full_out, swa_v2p=swa_v2p, swa_out=swa_out)
    ops.cache_locs.check_arguments(*arguments, **options)
    return build_cache_locs(*arguments, **options, specialised=specialised)


def build_compact_kv_indices(source, lens, kv_indptr, out, row_step=1, source_indptr=None, offset=0, step=1,
                             empty_fill=None, max_count=None, specialised=False):
    """The CuPy backend's ``build_compact_kv_indices`` through the host build (as ``build_page_table``)."""
    from kernels_cupy.launch import compact_csr_call  # noqa: PLC0415

    _require_cpu(source)
    run(compact_csr_call(source, lens, kv_indptr, out, row_step, source_indptr, offset, step, empty_fill, max_count),
        specialised)
    return out


def create_compact_kv_indices(source, lens, kv_indptr, out, *, row_step=1, source_indptr=None, offset=0, step=1,
                              empty_fill=None, max_count=None, specialised=False):
    """``kvdispatch.create_compact_kv_indices`` on CPU tensors, through the host build of the kernel."""
    options = dict(row_step=row_step, source_indptr=source_indptr, offset=offset, step=step, empty_fill=empty_fill,
                   max_count=max_count)
    ops.compact_csr.check_arguments(source, lens, kv_indptr, out, **options)
    return build_compact_kv_indices(source, lens, kv_indptr, out, **options, specialised=specialised)


def build_prefix_extend_kv_indices(prefix_lens, prefix_starts, extend_lens, extend_starts, kv_indptr, out,
                                   extend_base=0, specialised=False):
    """The CuPy backend's ``build_prefix_extend_kv_indices`` through the host build (as ``build_page_table``)."""
    from kernels_cupy.launch import prefix_extend_csr_call  # noqa: PLC0415

    _require_cpu(out)
    run(prefix_extend_csr_call(prefix_lens, prefix_starts, extend_lens, extend_starts, kv_indptr, out, extend_base),
        specialised)
    return out


def create_prefix_extend_kv_indices(prefix_lens, prefix_starts, extend_lens, extend_starts, kv_indptr, out, *,
                                    extend_base=0, specialised=False):
    """``kvdispatch.create_prefix_extend_kv_indices`` on CPU tensors, through the host build of the kernel."""
    arguments = (prefix_lens, prefix_starts, extend_lens, extend_starts, kv_indptr, out)
    ops.prefix_extend_csr.check_arguments(*arguments, extend_base)
    return build_prefix_extend_kv_indices(*arguments, extend_base, specialised)


# -- the block table of a ragged token CSR ----------------------------------------------------------------

def build_ragged_page_table(kv_indices, kv_indptr, page_table, page_size, swa_page_table=None, full_to_swa=None,
                            round_toward_zero=False, specialised=False):
    """The CuPy backend's ``build_ragged_page_table`` through the host build (as ``build_page_table``)."""
    from kernels_cupy.launch import ragged_page_table_call  # noqa: PLC0415

    _require_cpu(kv_indices)
    run(ragged_page_table_call(kv_indices, kv_indptr, page_table, page_size, swa_page_table, full_to_swa,
                               round_toward_zero), specialised)
    return page_table


def create_ragged_page_table(kv_indices, kv_indptr, page_table, *, page_size, swa_page_table=None, full_to_swa=None,
                             round_toward_zero=False, specialised=False):
    """``kvdispatch.create_ragged_page_table`` on CPU tensors, through the host build of the kernel."""
    ops.ragged_page_table.check_arguments(kv_indices, kv_indptr, page_table, page_size, swa_page_table, full_to_swa,
                                          round_toward_zero)
    return build_ragged_page_table(kv_indices, kv_indptr, page_table, page_size, swa_page_table, full_to_swa,
                                   round_toward_zero, specialised)


# -- the prefill-aware sliding-window token table ----------------------------------------------------------

def build_pa_swa_table(req_to_token, req_pool_indices, seq_lens, prefill_lens, out, kv_lens_out, window_size,
                       specialised=False):
    """The CuPy backend's ``build_pa_swa_table`` through the host build (as ``build_page_table``)."""
    from kernels_cupy.launch import pa_swa_table_call  # noqa: PLC0415

    _require_cpu(req_to_token)
    run(pa_swa_table_call(req_to_token, req_pool_indices, seq_lens, prefill_lens, out, kv_lens_out, window_size),
        specialised)
    return out


def create_prefill_aware_swa_table(req_to_token, req_pool_indices, seq_lens, prefill_lens, out, kv_lens_out, *,
                                   window_size, specialised=False):
    """``kvdispatch.create_prefill_aware_swa_table`` on CPU tensors, through the host build of the kernel."""
    ops.pa_swa_table.check_arguments(req_to_token, req_pool_indices, seq_lens, prefill_lens, out, kv_lens_out,
                                     window_size)
    return build_pa_swa_table(req_to_token, req_pool_indices, seq_lens, prefill_lens, out, kv_lens_out, window_size,
                              specialised)


# -- two token CSRs merged row by row ------------------------------------------------------------------------

def build_merged_kv_indices(prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens, extend_kv_indices,
                            kv_indptr_out, out, specialised=False):
    """The CuPy backend's ``build_merged_kv_indices`` through the host build (as ``build_page_table``)."""
    from kernels_cupy.launch import merged_token_csr_call  # noqa: PLC0415

    _require_cpu(out)
    run(merged_token_csr_call(prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens,
                              extend_kv_indices, kv_indptr_out, out), specialised)
    return out


def create_merged_kv_indices(prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens,
                             extend_kv_indices, kv_indptr_out, out, *, specialised=False):
    """``kvdispatch.create_merged_kv_indices`` on CPU tensors, through the host build of the kernel."""
    ops.merged_token_csr.check_arguments(prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens,
                                         extend_kv_indices, kv_indptr_out, out)
    return build_merged_kv_indices(prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens,
                                   extend_kv_indices, kv_indptr_out, out, specialised)


# -- each draft token's prefix-then-expand row -----------------------------------------------------------------

def build_spec_concat_page_table(page_table_a, page_table_b, seq_lens_a, seq_lens_b, out, draft_tokens,
                                 specialised=False):
    """The CuPy backend's ``build_spec_concat_page_table`` through the host build (as ``build_page_table``)."""
    from kernels_cupy.launch import spec_concat_page_table_call  # noqa: PLC0415

    _require_cpu(out)
    run(spec_concat_page_table_call(page_table_a, page_table_b, seq_lens_a, seq_lens_b, out, draft_tokens),
        specialised)
    return out


def create_spec_concat_page_table(page_table_a, page_table_b, seq_lens_a, seq_lens_b, out, *, draft_tokens,
                                  specialised=False):
    """``kvdispatch.create_spec_concat_page_table`` on CPU tensors, through the host build of the kernel."""
    ops.spec_concat_page_table.check_arguments(page_table_a, page_table_b, seq_lens_a, seq_lens_b, out, draft_tokens)
    return build_spec_concat_page_table(page_table_a, page_table_b, seq_lens_a, seq_lens_b, out, draft_tokens,
                                        specialised)
from kernels_cupy.launch import compact_draft_rows_call  # noqa: E402


def build_compact_draft_rows(target_req_to_token, req_pool_indices, suffix_start, draft_prefix_lens, verify_locs,
                             draft_req_to_token, pdl=False, specialised=False):
    """``kvdispatch.build_compact_draft_rows`` (the CuPy backend's launcher of the same name) on CPU tensors,
    through the host build of the kernel; the arguments are checked first."""
    arguments = (target_req_to_token, req_pool_indices, suffix_start, draft_prefix_lens, verify_locs,
                 draft_req_to_token)
    ops.compact_draft_rows.check_arguments(*arguments)
    _require_cpu(draft_req_to_token)
    run(compact_draft_rows_call(*arguments), specialised)
    return draft_req_to_token
