"""``kvdispatch.compat.sglang`` mirrors SGLang 0.5.23's modules: same dotted tails, names and signatures.

For each mirrored module ``sglang.<tail>``, ``kvdispatch.compat.sglang.<tail>`` holds exactly the names listed
below, each with SGLang's parameters (names, positional order, defaults, keyword-only markers) or value, and the
package re-exports every one of them. The expectations are written out here (from the release's source), and,
where SGLang's source is at hand (``SGLANG_SOURCE``, a directory holding the ``sglang`` package, or an
installed ``sglang``), also read from its files with ``ast``, without importing them.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
from pathlib import Path

import pytest

from kvdispatch.compat import sglang

# Module tail -> name -> its signature as ``_render`` writes it, or a constant's value.
RELEASE = {
    "kernels.ops.attention.kv_indices": {
        "create_flashinfer_kv_indices_triton": "(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, "
                                               "kv_indptr, kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, "
                                               "ENTRY_PAGE_SIZE=1, TOKEN_BLOCK_PARALLEL=False, token_mapping=None)",
        "create_chunked_prefix_cache_kv_indices": "(req_to_token_ptr, req_pool_indices_ptr, chunk_start_idx_ptr, "
                                                  "chunk_seq_lens_ptr, chunk_cu_seq_lens_ptr, chunk_kv_indices_ptr, "
                                                  "req_to_token_ptr_stride)",
        "create_flashmla_kv_indices_triton": "(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, "
                                             "kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, "
                                             "kv_indices_ptr_stride, PAGED_SIZE=64)",
        "get_num_page_per_block_flashmla": "(page_size=64)",
        "get_num_kv_index_blocks_flashmla": "(kv_indices_width, page_size)",
        "kv_indices_num_token_blocks": "(table_width, base_programs)",
        "spec_kv_index_token_blocks": "(table_width, kv_lens_sum, batch_size, base_programs=None, length_cap=None, "
                                      "context_len=None)",
        "SPEC_KV_INDEX_BLOCKS_MIN_CONTEXT": 32768,
    },
    "kernels.ops.attention.trtllm_mha_page_table": {
        "create_trtllm_mha_kv_indices_triton": "(req_to_token_ptr, req_pool_indices_ptr, seq_lens_ptr, "
                                               "full_to_swa_ptr, page_table_ptr, swa_page_table_ptr, "
                                               "full_to_swa_numel, req_to_token_stride, page_table_stride, "
                                               "PAGE_SIZE, HAS_SWA)",
        "build_trtllm_mha_page_table": "(req_to_token, req_pool_indices, cache_seqlens, page_table, page_size, "
                                       "swa_page_table=None, full_to_swa=None)",
        "get_num_mha_kv_index_blocks": "(num_pages, page_size)",
    },
    "kernels.ops.attention.dcp_kernels": {
        "create_triton_kv_indices_for_dcp_triton": "(req_to_token_ptr, req_pool_indices_ptr, dcp_kernel_lens_ptr, "
                                                   "kv_indptr, kv_start_idx, kv_indices_ptr, "
                                                   "req_to_token_ptr_stride, dcp_size, dcp_rank)",
        "create_mla_kv_page_table_for_dcp": "(req_to_token_ptr, req_pool_indices_ptr, local_seq_lens_ptr, "
                                            "block_kv_indices_ptr, v2p_ptr, req_to_token_stride, "
                                            "block_table_stride, PHYSICAL_PAGE_SIZE, DCP_SIZE, DCP_RANK, "
                                            "PAGES_PER_BLOCK, HAS_V2P)",
        "compact_dcp_verify_token_table_to_ragged": "(token_table_ptr, local_kv_lens_ptr, kv_indptr_ptr, "
                                                    "kv_indices_ptr, table_stride, Q_LEN, BLOCK_SIZE)",
        "update_kv_lens_and_indices": "(kv_lens, kv_lens_cumsum, kv_indices, local_kv_lens, local_kv_lens_cumsum, "
                                      "local_kv_indices, dcp_rank, dcp_world_size, BLOCK_SIZE)",
        "create_dcp_kv_indices": "(kv_indptr, extend_lens_ptr, extend_cu_lens_ptr, extend_prefix_lens_ptr, "
                                 "extend_cu_prefix_lens_ptr, kv_indices_ptr, extend_prefix_lens_sum, dcp_world_size)",
    },
    "kernels.ops.kvcache.kv_read_table": {
        "build_kv_read_table": "(*, req_to_token, req_pool_indices, seq_lens, v2p, page_size, max_pages, out, "
                               "seq_len_delta=0, zero_tail=False)",
        "build_kv_read_table_packed": "(*, req_to_token, req_pool_indices, seq_lens, v2p, indptr, page_size, "
                                      "max_tokens, out, kv_start_idx=None)",
    },
    "kernels.ops.speculative.cache_locs": {
        "generate_draft_decode_kv_indices": "(req_pool_indices, req_to_token, paged_kernel_lens, kv_indices, "
                                            "kv_indptr, positions, row_stride, kv_indices_stride, "
                                            "kv_indptr_stride, bs_upper, iter_upper, num_tokens_upper, page_size, "
                                            "window_size=0, sink_size=0, NUM_STEPS=0, ENTRY_PAGE_SIZE=1, v2p=None, "
                                            "TRANSLATE=False)",
        "assign_draft_cache_locs_contiguous_func": "(req_pool_indices, req_to_token, seq_lens, out_cache_loc, topk, "
                                                   "num_cols, positions=None, mrope=None)",
        "assign_extend_cache_locs_func": "(req_pool_indices, req_to_token, start_offset, end_offset, batch_size, "
                                         "draft_token_num, device)",
        "assign_extend_cache_locs_uniform_func": "(req_pool_indices, req_to_token, start_offset, batch_size, "
                                                 "draft_token_num, device, *, full_v2p=None, swa_v2p=None, "
                                                 "full_out=None, swa_out=None, page_size=1, positions_out=None, "
                                                 "anchor_src=None, anchor_out=None)",
        "fill_front_out_cache_loc_func": "(num_front, out_cache_loc, front_out_cache_loc)",
        "generate_draft_decode_window_kv_indices": "(req_pool_indices, req_to_token, paged_kernel_lens, "
                                                   "window_kv_indices, window_kv_indptr, positions, row_stride, "
                                                   "kv_indices_stride, kv_indptr_stride, bs_upper, iter_upper, "
                                                   "num_tokens_upper, page_size, window, ENTRY_PAGE_SIZE=1, "
                                                   "v2p=None, TRANSLATE=False)",
        "rebuild_compact_draft_req_to_token_func": "(*, draft_req_to_token, target_req_to_token, req_pool_indices, "
                                                   "suffix_start, draft_prefix_lens, verify_out_cache_loc_2d, "
                                                   "batch_size, block_size)",
    },
    "srt.layers.dcp.layout": {
        "get_dcp_lens": "(lens, dcp_size, dcp_rank, start=None, interleave_size=1)",
    },
    "srt.speculative.spec_utils": {
        "draft_kv_indices_buffer_width": "(num_seqs, topk, max_context_len)",
        "draft_kv_indices_used_len": "(seq_lens_sum, topk, bs, num_steps)",
    },
    "kernels.ops.attention.trtllm_mha_graph_metadata": {
        "update_trtllm_mha_graph_metadata": "(*, req_pool_indices, seq_lens, req_to_token, cache_seqlens, "
                                            "cu_seqlens_k, page_table, bs, seqlen_offset, max_seq_pages, page_size, "
                                            "swa_mapping=None, swa_page_table=None, out_cache_loc=None, "
                                            "swa_out_cache_loc=None, cu_seqlens_q=None, qlens=None, q_stride=0, "
                                            "q_mode=0, skip_page_table=False)",
    },
    "kernels.ops.attention.metadata": {
        "normal_decode_set_metadata": "(cache_seqlens_int32, cu_seqlens_k, page_table, req_to_token, "
                                      "req_pool_indices, max_seq_pages, seq_lens, seq_len_delta, page_size, "
                                      "swa_page_table=None, full_to_swa_index_mapping=None, skip_page_table=False, "
                                      "full_v2p=None, swa_v2p=None, zero_tail=False)",
        "draft_extend_set_metadata": "(cache_seqlens_int32, cu_seqlens_k, cu_seqlens_q, page_table, req_to_token, "
                                     "req_pool_indices, seq_lens, extend_seq_lens, page_size, "
                                     "full_to_swa_index_mapping=None, swa_page_table=None, out_cache_loc=None, "
                                     "swa_out_cache_loc=None)",
    },
}
RELEASE["kernels.ops.attention.aiter_unified_page_table"] = {
    "scatter_ragged_to_page_table_kernel": "(kv_flat_ptr, kv_indptr_ptr, dest_ptr, dest_stride, sw_page_table_ptr, "
                                           "swa_slot_mapping_ptr, PAGE_SIZE, BLOCK_SIZE, HAS_SWA)",
    "scatter_req_to_token_to_page_table_kernel": "(req_to_token_ptr, req_pool_indices_ptr, seq_lens_ptr, "
                                                 "page_table_ptr, req_to_token_stride, page_table_stride, "
                                                 "sw_page_table_ptr, swa_slot_mapping_ptr, DRAFT_NUM, PAGE_SIZE, "
                                                 "BLOCK_SIZE, HAS_SWA)",
}
RELEASE["kernels.ops.attention.pa_page_table"] = {
    "_build_pa_page_table": "(req_to_token, req_pool_indices, seq_lens, prefill_lens, window_size, bs, pa_max_len, "
                            "device, dst_page_table=None, dst_kv_lens=None)",
}
RELEASE["kernels.ops.attention.extend_attention"] = {
    "build_unified_kv_indices": "(prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens, "
                                "extend_kv_indices, bs)",
}
RELEASE["kernels.ops.attention.metadata"] |= {
    "prepare_swa_spec_page_table_triton": "(page_table_dst, page_table_a, page_table_b, seq_len_a, seq_len_b, "
                                          "speculative_num_draft_tokens)",
}
# Names of earlier, unreleased SGLang branches: no release has them.
UNRELEASED = ("update_trtllm_mla_graph_metadata", "build_kernel_page_table", "kv_indices_token_blocks_for_copy",
              "KV_INDICES_TOKEN_BLOCKS_MIN_WIDTH")


def _render(parameters):
    """``(a, b=1, *, c, d=None)``: names in order, ``=default`` (its ``repr``) where there is one, ``*`` before
    the first keyword-only one."""
    parts, starred = [], False
    for name, default, keyword_only in parameters:
        if keyword_only and not starred:
            parts.append("*")
            starred = True
        parts.append(name if default is inspect.Parameter.empty else f"{name}={default!r}")
    return f"({', '.join(parts)})"


def _drop_in_signature(function):
    return _render((p.name, p.default, p.kind is inspect.Parameter.KEYWORD_ONLY)
                   for p in inspect.signature(function).parameters.values())


def _mirror(tail):
    return importlib.import_module(f"kvdispatch.compat.sglang.{tail}")


@pytest.mark.parametrize("tail", RELEASE)
def test_each_module_holds_the_releases_names_and_signatures(tail):
    module = _mirror(tail)
    assert sorted(module.__all__) == sorted(RELEASE[tail])
    for name, expected in RELEASE[tail].items():
        value = getattr(module, name)
        if isinstance(expected, str):
            assert _drop_in_signature(value) == expected, f"{tail}.{name}"
            assert value.__name__ == name
            if callable(getattr(value, "__getitem__", None)):  # a launched builder: its grid launch too
                assert _drop_in_signature(value[(1,)]) == expected, f"{tail}.{name}[grid]"
        else:
            assert value == expected, f"{tail}.{name}"
        assert getattr(sglang, name) is value, f"kvdispatch.compat.sglang.{name}"


def test_the_package_reexports_every_name_and_none_unreleased():
    names = [name for names in RELEASE.values() for name in names]
    assert sorted(sglang.__all__) == sorted(names)
    namespace = {}
    exec("from kvdispatch.compat.sglang import *", namespace)
    assert set(names) <= set(namespace)
    for name in UNRELEASED:
        assert not hasattr(sglang, name), name
        for tail in RELEASE:
            assert not hasattr(_mirror(tail), name), f"{tail}.{name}"


def _release_root():
    """The directory holding SGLang's ``sglang`` package source, or None."""
    given = os.environ.get("SGLANG_SOURCE")
    if given and (Path(given) / "sglang").is_dir():
        return Path(given)
    spec = importlib.util.find_spec("sglang")  # locates a top-level package without running it
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).parent
    return None


def _literal(node, constants=None):
    """The value of ``node``: a literal, a module constant defined above it (``constants``), else its source."""
    if isinstance(node, ast.Name) and constants and node.id in constants:
        return constants[node.id]
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def _release_definitions(path):
    """Module-level functions (their parameters) and constants (their values) of the source at ``path``."""
    found = {}
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.FunctionDef):
            arguments = node.args
            positional = arguments.posonlyargs + arguments.args
            defaults = [inspect.Parameter.empty] * (len(positional) - len(arguments.defaults)) + [
                _literal(d, found) for d in arguments.defaults]
            parameters = [(a.arg, d, False) for a, d in zip(positional, defaults)]
            parameters += [(a.arg, inspect.Parameter.empty if d is None else _literal(d, found), True)
                           for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults)]
            found[node.name] = _render(parameters)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = _literal(node.value)
    return found


@pytest.mark.parametrize("tail", RELEASE)
def test_signatures_equal_the_release_source(tail):
    root = _release_root()
    if root is None:
        pytest.skip("SGLang's source is not here (set SGLANG_SOURCE to a directory holding the sglang package)")
    path = root / "sglang" / Path(*tail.split(".")).with_suffix(".py")
    if not path.is_file():
        pytest.skip(f"{path} is not in this copy of SGLang")
    release = _release_definitions(path)
    module = _mirror(tail)
    for name in module.__all__:
        assert name in release, f"sglang.{tail} has no {name}"
        value = getattr(module, name)
        expected = release[name]
        if callable(value):
            assert _drop_in_signature(value) == expected, f"{tail}.{name}"
        else:
            assert value == expected, f"{tail}.{name}"
        assert RELEASE[tail][name] == expected, f"the table above, {tail}.{name}"
