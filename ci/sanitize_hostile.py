"""Every available backend over hostile data on CUDA tensors, checked against the reference.

Meant for the GPU lane under the sanitizer (a clean exit there means no out-of-bounds access):

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 ci/sanitize_hostile.py

Hostile cases: pool indices outside the table (past the end, negative, int32 and int64 extremes, 2**40), lengths
past the table, negative and zero lengths, lengths at the int64 extremes with seqlen_offset at the int32 ones (the
sum must not wrap), kv_start_idx past the table, negative or at the int64 extremes, CSR kv_indptr past ``out``,
negative or at the int64 extremes (rows whose offsets would wrap back into ``out``, reading from a start next to
the end of the table); with and without fill_value; page sizes 1, 16, 64, 96; int32 and int64 index vectors.
The CSR options too: page-granular tables (entry_page_size 16 and 7, entries at the int32 extremes) with starts
and lengths at and far past a row's ``C * entry_page_size`` positions, token mappings that values fall outside of
(negative, at and past the end; one of 3 entries), int32 and int64 outputs. The decode-context-parallel ops too
(``create_dcp_kv_indices``, ``create_dcp_page_table``): the same spoilt requests at two DCP sizes and their last
rank, every CSR layout, rows longer than a program at every kv_indptr extreme.
The mapped page tables: the TRT-LLM MHA table with and without its SWA twin (full_to_swa of 3 int32 or many int64
entries at the extremes: slots clamped into it, quotients' low 32 bits) and the translated table (v2p at the
extremes or empty, multipliers at the int32 extremes, length deltas at the int32 extremes), on slot tables with
negative and extreme entries, under the same spoilt requests (page sizes 1, 64, 7).
The cache locations (``create_cache_locs``): the spoilt requests above, packed and fixed-width, translated or not.
The compact draft rows (``build_compact_draft_rows``): the spoilt requests above, int32 and int64 draft tables.
The draft decode indices: the spoilt pool indices and lengths above (2 branches, 3 steps, page sizes 1 and 16),
outputs narrower than the segments, positions at the extremes, a v2p that ids fall outside of, a window.
Tensors at other addresses, for every op (the ordinary page-1 table and token CSR, whose copies take 16-byte
accesses, and every option): each tensor of the call 1 or 3 elements past a 16-byte boundary (valid: the reference
result), and each tensor in turn released (``untyped_storage().resize_(0)``), over a storage one element short
of its view, or at one byte past an aligned address (refused with a ValueError naming it, nothing written).
Every tensor is its own exact-size allocation (PyTorch's caching allocator is turned off below, before torch is
imported), so an access one element past any of them is reported by memcheck.

``--programs-per-multiprocessor 1`` runs it all on a grid bounded to one program per multiprocessor, so that the
programs stride over their rows' blocks (the bounded grid's loop) under the sanitizer too.

Prints ``N cases, M mismatches`` and exits 1 on any mismatch or error. Without a GPU it runs on CPU tensors
(torch, and Triton where TRITON_INTERPRET=1), which checks the script itself. ``--device`` overrides.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")  # exact-size allocations for memcheck
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kvdispatch import ops
import kvdispatch  # noqa: E402
from kvdispatch import grid  # noqa: E402

PAGE_SIZES = (1, 16, 64, 96)
FILL_VALUES = (None, -1)
BATCH = 6
POISON = -123456789
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
# seqlen_offset for the cases that spoil a length (the others take 1): L = seq_lens + seqlen_offset is exact.
LENGTH_OFFSETS = (1, -1, I32_MAX, I32_MIN)
OPTION_ENTRY_PAGE_SIZES = (16, 7)
# (dcp_size, dcp_rank) of the DCP cases: a power of two and not, the last rank (the farthest first position); the
# token CSR runs the first without a start, the second with one.
DCP_RANKS = ((2, 1), (3, 2))
MAPPED_PAGE_SIZES = (1, 64, 7)


def hostile_requests(rows, cols, wide):
    """(name, pool, length, start) per case: the spoilt request; the others are valid."""
    cases = [
        ("pool-past-end", rows, None, None), ("pool-negative", -1, None, None),
        ("pool-int32-max", 2**31 - 1, None, None), ("pool-int32-min", -(2**31), None, None),
        ("length-past-table", None, cols * 3 + 5, None), ("length-int32-max", None, 2**31 - 1, None),
        ("length-negative", None, -5, None), ("length-zero", None, 0, None),
        ("start-past-table", None, None, cols + 3), ("start-at-end", None, None, cols),
        ("start-last-column", None, 50, cols - 1), ("start-negative", None, None, -2),
        ("start-int32-max", None, None, 2**31 - 1),
    ]
    if wide:
        cases += [("pool-2**40", 2**40, None, None), ("start-2**40", None, None, 2**40),
                  ("length-2**40", None, 2**40, None), ("pool-int64-max", I64_MAX, None, None),
                  ("pool-int64-min", I64_MIN, None, None), ("start-int64-max", None, 50, I64_MAX),
                  ("start-int64-min", None, 50, I64_MIN), ("length-int64-max", None, I64_MAX, None),
                  ("length-int64-min", None, I64_MIN, None), ("length-2**62", None, 2**62, None),
                  ("length-int64-min-plus-1", None, I64_MIN + 1, None)]
    return cases


def make(page_size, dtype, device, g, spoil):
    rows, cols = BATCH + 3, 5 * page_size + 7
    table = torch.randint(0, 2**31 - 1, (rows, cols), generator=g, dtype=torch.int64).to(torch.int32)
    pool = torch.randperm(rows, generator=g)[:BATCH]
    lengths = torch.randint(1, 4 * page_size + 1, (BATCH,), generator=g)
    start = torch.randint(0, page_size + 1, (BATCH,), generator=g)
    _, bad_pool, bad_length, bad_start = spoil
    for b in (0, BATCH - 1):  # first and last request: the last one is next to the end of every buffer
        if bad_pool is not None:
            pool[b] = bad_pool
        if bad_length is not None:
            lengths[b] = bad_length
        if bad_start is not None:
            start[b] = bad_start
    return dict(table=table.to(device), pool=pool.to(dtype).to(device), lens=lengths.to(dtype).to(device),
                start=start.to(dtype).to(device)), rows, cols


def option_hostile_requests(positions, wide):
    """As ``hostile_requests`` for a table whose rows have ``positions`` positions (``C * entry_page_size``)."""
    cases = [("start-past-positions", None, None, positions + 3), ("start-at-positions-end", None, None, positions),
             ("start-last-position", None, 50, positions - 1), ("length-past-positions", None, 2 * positions + 1, None),
             ("start-int32-max", None, 50, I32_MAX), ("pool-past-end", BATCH + 3, None, None)]
    if wide:
        cases += [("start-2**40", None, 50, 2**40), ("start-int64-max", None, 50, I64_MAX),
                  ("length-int64-max", None, I64_MAX, None), ("start-2**62", None, I64_MAX, 2**62)]
    return cases


def option_table(data, entry_page_size, g):
    """``data`` with a table of page ids: small ones (inside the mappings below, or just past them), negative
    ones and the int32 extremes, whose slots ``page * entry_page_size + offset`` need 64 bits."""
    table = torch.randint(-2, 24, data["table"].shape, generator=g, dtype=torch.int32)
    table.view(-1)[::11] = torch.tensor([I32_MIN, I32_MAX, -1])[torch.arange(table.numel())[::11] % 3].to(torch.int32)
    return dict(data, table=table.to(data["table"].device))


def hostile_mappings(entry_page_size, device, g):
    """None, an int64 mapping of the slots of 20 pages (values at the extremes), and an int32 one of 3 entries."""
    large = torch.randint(I64_MIN, I64_MAX, (20 * entry_page_size,), generator=g, dtype=torch.int64)
    large[:3] = torch.tensor([I64_MIN, I64_MAX, -1])
    return None, large.to(device), torch.tensor([I32_MAX, I32_MIN, 5], dtype=torch.int32, device=device)


def csr_layouts(data, cols, dtype, device, g):
    """kv_indptr layouts (no two rows overlap: which would win is undefined): packed; out too short for the
    last row; rows pointing past out; a negative first row."""
    lengths = data["lens"].cpu().long().clamp(min=0, max=cols)
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    total = int(starts[-1])
    yield "packed", starts, total
    yield "last-row-past-out-end", starts, int(starts[BATCH - 1]) + int(lengths[BATCH - 1]) // 2
    past = starts.clone()
    past[BATCH - 1], past[1] = total + 1, 2**31 - 1
    yield "indptr-past-out", past, total
    negative = starts.clone()
    negative[0] = -3  # row 0 starts at 0, so a negative start overlaps only its own entries
    yield "indptr-negative", negative, total
    if dtype == torch.int64:  # rows that land wholly outside out, from offsets that must not wrap
        extreme = starts.clone()
        extreme[0], extreme[1], extreme[2] = I64_MIN, I64_MIN + 3, I64_MIN + total
        extreme[3], extreme[BATCH - 1] = -(2**62), I64_MAX
        yield "indptr-int64-extremes", extreme, total


def long_row_indptrs(dtype, total):
    """kv_indptr values for one row as long as ``out``: before it by less than its length, just past it, and
    at the extremes (from ``-2**63 + k`` a row's offsets wrap back into ``out`` unless computed exactly)."""
    values = [-1, -(total - 1), total - 1, total, I32_MIN, I32_MAX]
    if dtype == torch.int64:
        values += [I64_MIN, I64_MIN + 1, I64_MIN + 5, I64_MIN + total - 1, I64_MIN + total, -(2**62), 2**62,
                   I64_MAX, I64_MAX - total]
    return values


DRAFT_PAGE_SIZES = (1, 16)


def draft_options(cpu, dtype, device, g):
    """Draft decode options per spoilt batch: plain into an out as wide as the table's rows allow, then into one
    a third of that (segments cut at its end); positions at the extremes; a v2p that ids fall outside of
    (negative, past its end, entries at the int64 extremes); a window with sinks; an int32 out."""
    width = 2 * BATCH * (5 * 16 + 7 + 3)
    yield dict(name="plain", width=width)
    yield dict(name="narrow-out", width=width // 3)
    positions = cpu["lens"].repeat_interleave(2)
    positions[1::3] = torch.tensor([I32_MAX, -1, 0, I32_MIN] + ([I64_MAX, I64_MIN] if dtype == torch.int64 else []),
                                   dtype=dtype).repeat(4)[: positions[1::3].shape[0]]
    yield dict(name="positions", width=width, positions=positions)
    v2p = torch.randint(-2, 2**40, (40,), generator=g, dtype=torch.int64)
    v2p[:3] = torch.tensor([I64_MIN, I64_MAX, -1])
    yield dict(name="v2p", width=width, v2p=v2p)
    yield dict(name="window", width=width, window_size=5, sink_size=3, out_dtype=torch.int32)
    yield dict(name="entry-pages", width=width * 4, v2p=v2p, entry_page_size=16)  # a page-granular table
    yield dict(name="step-window", width=width, positions=positions, step_window=7)
    yield dict(name="step-window-wide", width=width // 3, v2p=v2p, entry_page_size=4, step_window=2**31 - 1)


def storage_calls(device, g):
    """(public function, keyword arguments on ``device``, output names) of a valid call of every op: the
    ordinary page-1 table and token CSR (their 16-byte copies), then each op with its options; outputs poisoned."""
    rows, cols, batch = BATCH + 3, 5 * 16 + 7, BATCH

    def ints(low, high, shape, dtype=torch.int32):
        return torch.randint(low, high, shape, generator=g, dtype=torch.int64).to(dtype).to(device)

    def poison(*shape, dtype=torch.int32):
        return torch.full(shape, POISON, dtype=dtype, device=device)

    def common(lens_name="seq_lens"):
        return {"req_to_token": ints(0, I32_MAX, (rows, cols)), "req_pool_indices": ints(0, rows, (batch,)),
                lens_name: ints(1, cols // 2, (batch,), torch.int64)}

    def csr(lens_name="seq_lens"):
        args = common(lens_name)
        indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(args[lens_name].cpu(), 0)])
        return dict(args, kv_indptr=indptr.to(device), out=poison(int(indptr[-1]) + 5))

    start = ints(0, cols // 2, (batch,))
    yield "create_flashmla_kv_indices", dict(common(), out=poison(batch + 1, 2 * cols + 3), page_size=1), ("out",)
    yield "create_flashmla_kv_indices", dict(common(), out=poison(batch, 13), page_size=16, kv_start_idx=start,
                                             seq_lens_out=poison(batch), fill_value=-1), ("out", "seq_lens_out")
    yield "create_flashinfer_kv_indices", csr(), ("out",)
    yield "create_flashinfer_kv_indices", dict(csr(), kv_start_idx=start, entry_page_size=7,
                                               token_mapping=ints(-2, I32_MAX, (7 * cols,), torch.int64)), ("out",)
    yield "create_trtllm_mha_page_table", dict(common(), page_table=poison(batch, 9), page_size=16,
                                               swa_page_table=poison(batch, 5),
                                               full_to_swa=ints(-3, 2**20, (2**12,), torch.int64)), (
        "page_table", "swa_page_table")
    yield "create_translated_page_table", dict(common(), v2p=ints(-1, 2**10, (2**14,)), out=poison(batch, 9),
                                               page_size=16, multiplier=3), ("out",)
    for page_size, options in ((1, {}), (16, dict(positions=ints(0, cols, (2 * batch,)), v2p=ints(-1, 2**10, (50,)),
                                                  window_size=5, sink_size=3))):
        yield "create_draft_decode_kv_indices", dict(common(), kv_indptr=poison(3, 2 * batch + 1),
                                                     out=poison(3, 301, dtype=torch.int64), num_steps=3, topk=2,
                                                     page_size=page_size, **options), ("kv_indptr", "out")
    yield "create_dcp_kv_indices", dict(csr("local_seq_lens"), dcp_size=2, dcp_rank=1, kv_start_idx=start), ("out",)
    yield "create_dcp_page_table", dict(common("local_seq_lens"), out=poison(batch, 7), page_size=16, dcp_size=3,
                                        dcp_rank=2, fill_value=-1), ("out",)
    yield "update_decode_metadata", dict(common(), cache_seqlens=poison(batch), cu_seqlens_k=poison(batch + 1),
                                         page_size=16, page_table=poison(batch, 9), swa_page_table=poison(batch, 5),
                                         full_to_swa=ints(-3, 2**20, (2**12,), torch.int64),
                                         full_v2p=ints(-1, 2**10, (2**14,)), cu_seqlens_q=poison(batch + 1),
                                         qlens=ints(0, 5, (batch,)), out_cache_loc=ints(-1, 2**12, (2 * batch,)),
                                         swa_out_cache_loc=poison(2 * batch + 3, dtype=torch.int64)), (
        "cache_seqlens", "cu_seqlens_k", "page_table", "swa_page_table", "cu_seqlens_q", "swa_out_cache_loc")
    yield "create_cache_locs", dict(common("end_offset"), start_offset=start, out=poison(4 * batch, dtype=torch.int64),
                                    positions_out=poison(4 * batch), page_size=16, full_v2p=ints(-1, 2**10, (50,)),
                                    full_out=poison(4 * batch, dtype=torch.int64)), ("out", "positions_out", "full_out")
    lens = torch.randint(0, 9, (BATCH,), generator=g).to(device)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lens.cpu().clamp(min=1), 0)]).to(device)
    yield "create_compact_kv_indices", dict(
        source=torch.randint(0, I32_MAX, (1, 200), generator=g, dtype=torch.int32).to(device), lens=lens,
        kv_indptr=indptr, out=torch.full((int(indptr[-1]) + 3,), POISON, dtype=torch.int32, device=device), row_step=0,
        source_indptr=torch.arange(BATCH, device=device) * 20, offset=1, step=2, empty_fill=0, max_count=6), ("out",)
    prefix, extend = (torch.randint(0, 9, (BATCH,), generator=g).to(device) for _ in range(2))
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum((prefix + extend).cpu(), 0)]).to(device)
    yield "create_prefix_extend_kv_indices", dict(
        prefix_lens=prefix, prefix_starts=torch.arange(BATCH, device=device) * 9, extend_lens=extend,
        extend_starts=torch.arange(BATCH, device=device) * 7, kv_indptr=indptr,
        out=torch.full((int(indptr[-1]) + 3,), POISON, dtype=torch.int32, device=device), extend_base=60), ("out",)
    rows, cols = BATCH + 3, 5 * 16 + 7
    yield "create_dcp_page_table", dict(
        req_to_token=torch.randint(0, 1 << 16, (rows, cols), generator=g, dtype=torch.int32).to(device),
        req_pool_indices=torch.randint(0, rows, (BATCH,), generator=g).to(device),
        local_seq_lens=torch.randint(1, cols // 4, (BATCH,), generator=g).to(device),
        out=torch.full((BATCH, 7), POISON, dtype=torch.int32, device=device), page_size=16, dcp_size=2, dcp_rank=1,
        v2p=torch.randint(-1, 1 << 20, (1 << 12,), generator=g).to(device)), ("out",)
    yield "build_compact_draft_rows", dict(
        target_req_to_token=ints(0, I32_MAX, (rows, cols)),
        req_pool_indices=torch.randperm(rows, generator=g)[:batch].to(device), suffix_start=start,
        draft_prefix_lens=ints(0, 36, (batch,)), verify_locs=ints(0, I32_MAX, (batch, 4), torch.int64),
        draft_req_to_token=poison(rows, 40)), (
        "draft_req_to_token",)


def element_offset(t, shift):
    """``t``'s values in an allocation of its own that the view ends, ``shift`` elements past its start."""
    base = torch.empty(t.numel() + shift, dtype=t.dtype, device=t.device)
    return base[shift:].view(t.shape).copy_(t)


def byte_offset(t):
    """``t``'s values one byte past the start of an allocation of its own; returns the view and the allocation."""
    base = torch.zeros(t.nbytes + 16, dtype=torch.uint8, device=t.device)
    storage = torch._C._construct_storage_from_data_pointer(base.data_ptr() + 1, t.device, t.nbytes)
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, 0, t.shape, t.contiguous().stride()), base


def resized(t, nbytes):
    """A copy of ``t`` whose storage is then resized to ``nbytes``."""
    t = t.clone()
    t.untyped_storage().resize_(nbytes)
    return t


# How a tensor is spoilt: (the spoilt tensor, the allocation behind it, to keep alive while it is used).
STORAGE_SPOILERS = {"released": lambda t: (resized(t, 0), None),
                    "shrunk": lambda t: (resized(t, t.nbytes - t.itemsize), None), "byte-offset": byte_offset}


class Tally:
    """One group of cases of ``shard`` = (k, n): of the cases offered, those whose ordinal (from 0, within the
    group) is k modulo n are run and counted."""

    def __init__(self, shard, verbose):
        self.shard, self.verbose = shard, verbose
        self.offered = self.cases = self.mismatches = 0

    def selected(self):
        """Whether the next case is this shard's (then it is counted)."""
        self.offered += 1
        mine = (self.offered - 1) % self.shard[1] == self.shard[0]
        self.cases += mine
        return mine

    def compare(self, what, pairs):
        """Each ``(got, expected)`` of ``pairs`` whose ``got`` differs is a mismatch (printed)."""
        for i, (got, expected) in enumerate(pairs):
            if not torch.equal(got.cpu(), expected):
                self.mismatches += 1
                bad = (got.cpu() != expected).nonzero()
                print(f"MISMATCH {what}{f' output {i}' if i else ''}: {bad.shape[0]} entries differ, first at "
                      f"{bad[0].tolist()}", flush=True)

    def launch_and_compare(self, what, launch, pairs):
        """Run ``launch()``, which writes the poisoned ``got`` of each ``(got, expected)`` of ``pairs``, then
        compare them with the reference's ``expected``; an exception is one mismatch (printed)."""
        try:
            launch()
            self.compare(what, pairs)
        except Exception:
            self.mismatches += 1
            print(f"ERROR {what}:\n{traceback.format_exc()}", flush=True)
        if self.verbose:
            print("ran", what, flush=True)


def run(device, backends, verbose, shard=(0, 1)):
    """Run the cases of ``shard`` = (k, n) (``Tally``; all data is still drawn, so every shard sees the cases the
    whole run would): ``(cases, mismatches)``."""
    g = torch.Generator().manual_seed(0)
    tally = Tally(shard, verbose)

    def page_table_case(what, data, cpu, page_size, with_start, seqlen_offset, fill_value):
        if not tally.selected():
            return
        width = 5
        out = torch.full((BATCH, width), POISON, dtype=torch.int32, device=device)
        seq_out = torch.full((BATCH,), POISON, dtype=torch.int32, device=device)
        expected = torch.full((BATCH, width), POISON, dtype=torch.int32)
        expected_seq = seq_out.cpu().clone()  # .cpu() of a CPU tensor is no copy
        start, start_cpu = (data["start"], cpu["start"]) if with_start else (None, None)
        ops.page_table.reference(cpu["table"], cpu["pool"], cpu["lens"], expected, page_size, start_cpu,
                                   seqlen_offset, expected_seq, fill_value)
        tally.launch_and_compare(what, lambda: kvdispatch.create_flashmla_kv_indices(
            data["table"], data["pool"], data["lens"], out, page_size=page_size, kv_start_idx=start,
            seqlen_offset=seqlen_offset, seq_lens_out=seq_out, fill_value=fill_value, backend=backend),
            ((out, expected), (seq_out, expected_seq)))

    def token_csr_case(what, data, cpu, indptr, total, with_start, out_dtype=torch.int32, entry_page_size=1,
                       token_mapping=None, v2p=None, page_size=1):
        if not tally.selected():
            return
        flat = torch.full((total,), POISON, dtype=out_dtype, device=device)
        expected = flat.cpu().clone()
        start, start_cpu = (data["start"], cpu["start"]) if with_start else (None, None)
        ops.token_csr.reference(cpu["table"], cpu["pool"], cpu["lens"], indptr, expected, start_cpu,
                                      entry_page_size, None if token_mapping is None else token_mapping.cpu(),
                                      None if v2p is None else v2p.cpu(), page_size)
        tally.launch_and_compare(what, lambda: kvdispatch.create_flashinfer_kv_indices(
            data["table"], data["pool"], data["lens"], indptr.to(data["pool"].dtype).to(device), flat,
            kv_start_idx=start, entry_page_size=entry_page_size, token_mapping=token_mapping, v2p=v2p,
            page_size=page_size, backend=backend),
            ((flat, expected),))

    def mapped_case(what, op, data, cpu, page_size, lookup, **options):
        """The MHA page table (``lookup``: full_to_swa, None for none) or the translated one (``lookup``: v2p)
        into exact-size tables: the MHA ones 5 and 7 pages wide, the translated one 5."""
        if not tally.selected():
            return
        outs = [torch.full((BATCH, width), POISON, dtype=torch.int32, device=device) for width in (5, 7)]
        expected = [out.cpu().clone() for out in outs]
        lookup_cpu = None if lookup is None else lookup.cpu()
        if op == "mha":
            swa = None if lookup is None else (outs[1], expected[1])
            ops.mha_page_table.reference(cpu["table"], cpu["pool"], cpu["lens"], expected[0], page_size,
                                           swa and swa[1], lookup_cpu, options["round_toward_zero"])
            launch = lambda: kvdispatch.create_trtllm_mha_page_table(  # noqa: E731
                data["table"], data["pool"], data["lens"], outs[0], page_size=page_size,
                swa_page_table=swa and swa[0], full_to_swa=lookup, backend=backend, **options)
        else:
            ops.translated_page_table.reference(cpu["table"], cpu["pool"], cpu["lens"], lookup_cpu, expected[0],
                                                  page_size, **options)
            launch = lambda: kvdispatch.create_translated_page_table(  # noqa: E731
                data["table"], data["pool"], data["lens"], lookup, outs[0], page_size=page_size, backend=backend,
                **options)
        tally.launch_and_compare(what, launch, tuple(zip(outs, expected)))

    def draft_decode_case(what, data, cpu, page_size, width, positions=None, v2p=None, window_size=0, sink_size=0,
                          out_dtype=torch.int64, entry_page_size=1, step_window=0):
        if not tally.selected():
            return
        steps, topk = 3, 2
        out = torch.full((steps, width), POISON, dtype=out_dtype, device=device)
        indptr = torch.full((steps, BATCH * topk + 1), POISON, dtype=torch.int32, device=device)
        expected, expected_indptr = out.cpu().clone(), indptr.cpu().clone()
        options = dict(num_steps=steps, topk=topk, page_size=page_size, window_size=window_size, sink_size=sink_size,
                       entry_page_size=entry_page_size, step_window=step_window)
        ops.draft_decode.reference(cpu["table"], cpu["pool"], cpu["lens"], expected_indptr, expected,
                                             positions=positions, v2p=v2p, **options)
        tally.launch_and_compare(what, lambda: kvdispatch.create_draft_decode_kv_indices(
            data["table"], data["pool"], data["lens"], indptr, out, backend=backend, **options,
            positions=None if positions is None else positions.to(device),
            v2p=None if v2p is None else v2p.to(device)), ((out, expected), (indptr, expected_indptr)))

    def dcp_csr_case(what, data, cpu, indptr, total, with_start, dcp_size, dcp_rank, out_dtype):
        """The DCP token CSR, the lengths taken as the rank's counts; rounding toward zero with an int64 out."""
        if not tally.selected():
            return
        flat = torch.full((total,), POISON, dtype=out_dtype, device=device)
        expected = flat.cpu().clone()
        start, start_cpu = (data["start"], cpu["start"]) if with_start else (None, None)
        toward_zero = out_dtype == torch.int64
        ops.dcp_token_csr.reference(cpu["table"], cpu["pool"], cpu["lens"], indptr, expected, dcp_size,
                                          dcp_rank, start_cpu, toward_zero)
        tally.launch_and_compare(what, lambda: kvdispatch.create_dcp_kv_indices(
            data["table"], data["pool"], data["lens"], indptr.to(data["pool"].dtype).to(device), flat,
            dcp_size=dcp_size, dcp_rank=dcp_rank, kv_start_idx=start, round_toward_zero=toward_zero, backend=backend),
            ((flat, expected),))

    def dcp_table_case(what, data, cpu, page_size, dcp_size, dcp_rank, fill_value):
        if not tally.selected():
            return
        out = torch.full((BATCH, 3), POISON, dtype=torch.int32, device=device)
        expected = out.cpu().clone()
        ops.dcp_page_table.reference(cpu["table"], cpu["pool"], cpu["lens"], expected, page_size, dcp_size,
                                       dcp_rank, fill_value)
        tally.launch_and_compare(what, lambda: kvdispatch.create_dcp_page_table(
            data["table"], data["pool"], data["lens"], out, page_size=page_size, dcp_size=dcp_size, dcp_rank=dcp_rank,
            fill_value=fill_value, backend=backend), ((out, expected),))

    def storage_case(what, function, args, outputs, shift=None, spoilt=None):
        """``function`` on ``args`` with every tensor ``shift`` elements past the start of its allocation
        (compared with the torch backend on CPU copies), or with the tensor ``spoilt`` = (name, kind) spoilt as
        ``STORAGE_SPOILERS[kind]`` does (refused with a ValueError naming it, every other output its poison)."""
        if not tally.selected():
            return
        call = dict(args)
        try:
            if spoilt is None:
                expected = {k: v.cpu().clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
                getattr(kvdispatch, function)(**expected, backend="torch")
                call.update({k: element_offset(v, shift) for k, v in args.items() if isinstance(v, torch.Tensor)})
                getattr(kvdispatch, function)(**call, backend=backend)
                for name in outputs:
                    tally.compare(f"{what} {name}", [(call[name], expected[name])])
            else:
                name, kind = spoilt
                call[name], keep = STORAGE_SPOILERS[kind](args[name])  # noqa: F841  (keep: its allocation)
                try:
                    getattr(kvdispatch, function)(**call, backend=backend)
                    raise AssertionError(f"not refused: {what}")
                except ValueError as error:
                    if not str(error).startswith(name):
                        raise AssertionError(f"the error does not name {name}: {error}") from error
                for output in outputs:
                    if output != name and not bool((call[output] == POISON).all()):
                        raise AssertionError(f"{output} written by a refused call")
        except Exception:
            tally.mismatches += 1
            print(f"ERROR {what}:\n{traceback.format_exc()}", flush=True)
        if verbose:
            print("ran", what, flush=True)

    for backend in backends:
        for page_size in PAGE_SIZES:
            for dtype in (torch.int32, torch.int64):
                for spoil in hostile_requests(BATCH + 3, 5 * page_size + 7, dtype == torch.int64):
                    data, rows, cols = make(page_size, dtype, device, g, spoil)
                    cpu = {k: v.cpu() for k, v in data.items()}
                    offsets = LENGTH_OFFSETS if spoil[0].startswith("length") else (1,)
                    for seqlen_offset, fill_value, with_start in itertools.product(offsets, FILL_VALUES,
                                                                                    (False, True)):
                        page_table_case(f"{backend} page_table page={page_size} {str(dtype)[6:]} {spoil[0]} "
                                        f"offset={seqlen_offset} fill={fill_value} start={with_start}",
                                        data, cpu, page_size, with_start, seqlen_offset, fill_value)
                    if page_size != 16:
                        continue  # the CSR op has no page size: one table shape is enough
                    for layout, indptr, total in csr_layouts(data, cols, dtype, device, g):
                        for with_start in (False, True):
                            token_csr_case(f"{backend} token_csr {str(dtype)[6:]} {spoil[0]} {layout} "
                                           f"start={with_start}", data, cpu, indptr, total, with_start)
        # One row longer than a program, read from the last column of the last table row, at every
        # kv_indptr extreme: a wrapped offset would read past the table and write into out.
        total = grid.items_per_program(grid.TOKEN_CSR) + 300
        for dtype in (torch.int32, torch.int64):
            for value in long_row_indptrs(dtype, total):
                cpu = dict(table=torch.randint(0, I32_MAX, (3, total), generator=g, dtype=torch.int32),
                           pool=torch.tensor([2], dtype=dtype), lens=torch.tensor([I32_MAX], dtype=dtype),
                           start=torch.tensor([total - 1], dtype=dtype))
                data = {k: v.to(device) for k, v in cpu.items()}
                for with_start in (False, True):
                    token_csr_case(f"{backend} token_csr long row {str(dtype)[6:]} indptr={value} "
                                   f"start={with_start}", data, cpu, torch.tensor([value, 0]), total, with_start)
        for entry_page_size, dtype in itertools.product(OPTION_ENTRY_PAGE_SIZES, (torch.int32, torch.int64)):
            positions = (5 * 16 + 7) * entry_page_size  # make's table for page size 16
            mappings = hostile_mappings(entry_page_size, device, g)
            for spoil in option_hostile_requests(positions, dtype == torch.int64):
                data, rows, cols = make(16, dtype, device, g, spoil)
                data = option_table(data, entry_page_size, g)
                cpu = {k: v.cpu() for k, v in data.items()}
                for layout, indptr, total in csr_layouts(data, positions, dtype, device, g):
                    for mapping, out_dtype in itertools.product(mappings, (torch.int32, torch.int64)):
                        token_csr_case(f"{backend} token_csr entry_page_size={entry_page_size} {str(dtype)[6:]} "
                                       f"{spoil[0]} {layout} mapping={None if mapping is None else mapping.shape[0]} "
                                       f"out={str(out_dtype)[6:]}", data, cpu, indptr, total, True, out_dtype,
                                       entry_page_size, mapping)
        for page_size, dtype in itertools.product(MAPPED_PAGE_SIZES, (torch.int32, torch.int64)):  # through v2p
            lookups = hostile_mappings(page_size, device, g)[1:]
            for spoil in hostile_requests(BATCH + 3, 5 * page_size + 7, dtype == torch.int64):
                data, rows, cols = make(page_size, dtype, device, g, spoil)
                cpu = {k: v.cpu() for k, v in data.items()}
                for (layout, indptr, total), v2p, out_dtype in itertools.product(
                        csr_layouts(data, cols, dtype, device, g), lookups, (torch.int32, torch.int64)):
                    token_csr_case(f"{backend} token_csr v2p={v2p.shape[0]} page={page_size} {str(dtype)[6:]} "
                                   f"{spoil[0]} {layout} out={str(out_dtype)[6:]}", data, cpu, indptr, total, True,
                                   out_dtype, v2p=v2p, page_size=page_size)
        for page_size, dtype in itertools.product(MAPPED_PAGE_SIZES, (torch.int32, torch.int64)):
            lookups = hostile_mappings(page_size, device, g)
            for spoil in hostile_requests(BATCH + 3, 5 * page_size + 7, dtype == torch.int64):
                if spoil[3] is not None:
                    continue  # these tables take no start
                data, rows, cols = make(page_size, dtype, device, g, spoil)
                # Slots as make draws them (mostly past the mappings: clamped to their last entry), floor
                # division; then negative and extreme ones, divided toward zero.
                for table_kind, tables in (("slots", data), ("negative", option_table(data, page_size, g))):
                    cpu = {k: v.cpu() for k, v in tables.items()}
                    for mapping in lookups:
                        mapped_case(f"{backend} mha_page_table page={page_size} {str(dtype)[6:]} {spoil[0]} "
                                    f"{table_kind} mapping={None if mapping is None else mapping.shape[0]}", "mha",
                                    tables, cpu, page_size, mapping, round_toward_zero=table_kind == "negative")
                deltas = LENGTH_OFFSETS if spoil[0].startswith("length") else (0,)
                translations = ((lookups[1], 1), (lookups[1], I32_MIN), (lookups[2], I32_MAX), (lookups[1][:0], 3))
                for (v2p, multiplier), delta in itertools.product(translations, deltas):
                    mapped_case(f"{backend} translated_page_table page={page_size} {str(dtype)[6:]} {spoil[0]} "
                                f"v2p={v2p.shape[0]} multiplier={multiplier} delta={delta}", "translated", tables,
                                cpu, page_size, v2p, multiplier=multiplier, max_pages=None if multiplier == 1 else 3,
                                seq_len_delta=delta)
                for v2p, delta in itertools.product(lookups[1:3], deltas):  # a fill: SGLang's zero tail
                    mapped_case(f"{backend} translated_page_table page={page_size} {str(dtype)[6:]} {spoil[0]} "
                                f"v2p={v2p.shape[0]} delta={delta} fill", "translated", tables, cpu, page_size, v2p,
                                max_pages=4, seq_len_delta=delta, fill_value=0)
        for page_size, dtype in itertools.product(DRAFT_PAGE_SIZES, (torch.int32, torch.int64)):
            for spoil in hostile_requests(BATCH + 3, 5 * page_size + 7, dtype == torch.int64):
                if spoil[3] is not None:
                    continue  # the draft op has no start positions
                data, rows, cols = make(page_size, dtype, device, g, spoil)
                cpu = {k: v.cpu() for k, v in data.items()}
                for options in draft_options(cpu, dtype, device, g):
                    draft_decode_case(f"{backend} draft_decode page={page_size} {str(dtype)[6:]} {spoil[0]} "
                                      f"{options.pop('name')}", data, cpu, page_size, **options)
        for dtype in (torch.int32, torch.int64):
            for spoil in hostile_requests(BATCH + 3, 5 * 16 + 7, dtype == torch.int64):
                data, rows, cols = make(16, dtype, device, g, spoil)
                cpu = {k: v.cpu() for k, v in data.items()}
                for (dcp_size, dcp_rank), page_size in itertools.product(DCP_RANKS, (1, 16)):
                    dcp_table_case(f"{backend} dcp_page_table page={page_size} dcp={dcp_size}/{dcp_rank} "
                                   f"{str(dtype)[6:]} {spoil[0]}", data, cpu, page_size, dcp_size, dcp_rank,
                                   -1 if page_size == 1 else None)
                for ((dcp_size, dcp_rank), with_start), (layout, indptr, total) in itertools.product(
                        zip(DCP_RANKS, (False, True)), csr_layouts(data, cols, dtype, device, g)):
                    dcp_csr_case(f"{backend} dcp_token_csr dcp={dcp_size}/{dcp_rank} {str(dtype)[6:]} "
                                 f"{spoil[0]} {layout} start={with_start}", data, cpu, indptr, total, with_start,
                                 dcp_size, dcp_rank, dtype)
            # Rows longer than a program, from the last positions of the last table row, at every kv_indptr extreme.
            total = grid.items_per_program(grid.DCP_TOKEN_CSR) + 300
            for value in long_row_indptrs(dtype, total):
                cpu = dict(table=torch.randint(0, I32_MAX, (3, 2 * total), generator=g, dtype=torch.int32),
                           pool=torch.tensor([2], dtype=dtype), lens=torch.tensor([I32_MAX], dtype=dtype),
                           start=torch.tensor([3], dtype=dtype))
                data = {k: v.to(device) for k, v in cpu.items()}
                for with_start in (False, True):
                    dcp_csr_case(f"{backend} dcp_token_csr long row {str(dtype)[6:]} indptr={value} "
                                 f"start={with_start}", data, cpu, torch.tensor([value, 0]), total, with_start, 2, 1,
                                 torch.int64)
        # One decode step's metadata on hostile requests: every option, the maps' extremes, hostile locations.
        for page_size, dtype in itertools.product(MAPPED_PAGE_SIZES, (torch.int32, torch.int64)):
            lookups = hostile_mappings(page_size, device, g)
            for spoil in hostile_requests(BATCH + 3, 5 * page_size + 7, dtype == torch.int64):
                if spoil[3] is not None:
                    continue  # the op takes no start
                data, rows, cols = make(page_size, dtype, device, g, spoil)
                for (mapping, v2p), offset in itertools.product(((lookups[1], lookups[2]), (lookups[2], lookups[1]),
                                                                 (lookups[1][:0], lookups[1][:0])), LENGTH_OFFSETS):
                    args = dict(req_to_token=option_table(data, page_size, g)["table"], req_pool_indices=data["pool"],
                                seq_lens=data["lens"], cache_seqlens=torch.full((BATCH,), POISON, dtype=torch.int32,
                                                                                device=device),
                                cu_seqlens_k=torch.full((BATCH + 1,), POISON, dtype=torch.int32, device=device),
                                page_size=page_size, seqlen_offset=offset,
                                page_table=torch.full((BATCH, 5), POISON, dtype=torch.int32, device=device),
                                swa_page_table=torch.full((BATCH, 7), POISON, dtype=torch.int32, device=device),
                                full_to_swa=mapping, full_v2p=v2p, zero_tail=offset == 1,
                                cu_seqlens_q=torch.full((BATCH,), POISON, dtype=torch.int32, device=device),
                                qlens=data["lens"], out_cache_loc=torch.tensor([I64_MIN, -1, 0, 5, 2**40, I64_MAX],
                                                                               device=device),
                                swa_out_cache_loc=torch.full((9,), POISON, dtype=dtype, device=device))
                    storage_case(f"{backend} update_decode_metadata page={page_size} {str(dtype)[6:]} {spoil[0]} "
                                 f"map={mapping.shape[0]} offset={offset}", "update_decode_metadata", args,
                                 ("cache_seqlens", "cu_seqlens_k", "page_table", "swa_page_table", "cu_seqlens_q",
                                  "swa_out_cache_loc"), shift=1)
        # Cache locations: the spoilt requests above, their lengths taken as the slices' ends (packed) or a fixed
        # width, with positions and the value through a v2p that ids fall outside of.
        for dtype in (torch.int32, torch.int64):
            for spoil in hostile_requests(BATCH + 3, 5 * 16 + 7, dtype == torch.int64):
                data, rows, cols = make(16, dtype, device, g, spoil)
                cpu = {k: v.cpu() for k, v in data.items()}
                v2p = torch.randint(-2, 2**20, (rows * cols // 16 - 3,), generator=g)
                for packed, translated in itertools.product((False, True), repeat=2):
                    if not tally.selected():
                        continue
                    outs = [torch.full((4 * BATCH + 3,), POISON, dtype=torch.int64, device=device)
                            for _ in range(3 if translated else 1)]
                    expected = [out.cpu().clone() for out in outs]
                    options = [dict(end_offset=tensors["lens"]) if packed else dict(width=4) for tensors in (cpu, data)]
                    if translated:
                        for option, maps, written in zip(options, (v2p, v2p.to(device)), (expected, outs)):
                            option.update(positions_out=written[1], page_size=16, full_v2p=maps, full_out=written[2])
                    ops.cache_locs.reference(cpu["table"], cpu["pool"], cpu["start"], expected[0], **options[0])
                    tally.launch_and_compare(f"{backend} cache_locs {str(dtype)[6:]} {spoil[0]} packed={packed} "
                                     f"translated={translated}", lambda: kvdispatch.create_cache_locs(
                                         data["table"], data["pool"], data["start"], outs[0], backend=backend,
                                         **options[1]), list(zip(outs, expected)))
        # Compact draft rows: the spoilt requests above (their lengths as the prefix lengths, their starts as the
        # suffix starts), a draft table narrower and a target table shorter than some of the rows.
        for dtype in (torch.int32, torch.int64):
            for spoil in hostile_requests(BATCH + 3, 5 * 16 + 7, dtype == torch.int64):
                if not tally.selected():
                    continue
                data, rows, cols = make(16, dtype, device, g, spoil)
                verify = torch.randint(0, 2**40, (BATCH, 5), generator=g).to(device)
                draft = torch.full((rows + 2, 48), POISON, dtype=dtype, device=device)
                arguments = (data["table"], data["pool"], data["start"], data["lens"], verify)
                expected = ops.compact_draft_rows.reference(*(t.cpu() for t in arguments), draft.cpu().clone())
                tally.launch_and_compare(f"{backend} compact_draft_rows {str(dtype)[6:]} {spoil[0]}",
                                 lambda: kvdispatch.build_compact_draft_rows(*arguments, draft, backend=backend),
                                 [(draft, expected)])
        for function, args, outputs in storage_calls(device, g):
            for shift in (1, 3):
                storage_case(f"{backend} {function} page={args.get('page_size')} element-offset={shift}", function,
                             args, outputs, shift=shift)
            for name, kind in itertools.product([k for k, v in args.items() if isinstance(v, torch.Tensor)],
                                                STORAGE_SPOILERS):
                storage_case(f"{backend} {function} {name} {kind}", function, args, outputs, spoilt=(name, kind))
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # surfaces a device-side fault here, under this backend's name
        print(f"backend {backend}: done", flush=True)
    tallies = [tally, run_table_ops(device, backends, verbose, shard)]
    for hostile in HOSTILE_OPS:
        tallies.append(Tally(shard, verbose))
        for what, launch, out, expected in hostile(device, backends):
            if tallies[-1].selected():
                tallies[-1].launch_and_compare(what, launch, ((out, expected),))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return sum(t.cases for t in tallies), sum(t.mismatches for t in tallies)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", help="default: cuda if there is a GPU, else cpu")
    parser.add_argument("--backend", action="append", help="only this backend (repeatable); default: all available")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--programs-per-multiprocessor", type=int, metavar="N",
                        help="the grid's budget (kvdispatch.grid.PROGRAMS_PER_MULTIPROCESSOR) for this run: a small "
                             "one makes every program stride over several blocks of its row")
    parser.add_argument("--shard", default="1/1", metavar="K/N",
                        help="run only the K-th of N interleaved parts of the cases (processes in parallel)")
    args = parser.parse_args(argv)
    k, _, n = args.shard.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        parser.error(f"--shard must be K/N with 1 <= K <= N; got {args.shard!r}")
    if args.programs_per_multiprocessor is not None:
        kvdispatch.grid.PROGRAMS_PER_MULTIPROCESSOR = args.programs_per_multiprocessor
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    available = kvdispatch.available_backends(device)
    backends = args.backend or available
    info = kvdispatch.probe(device)
    print(f"device {device}: {info.name} ({info.arch}, {info.family}); backends {', '.join(backends)}"
          f"{'' if device.type == 'cuda' else ' (no GPU: a check of this script, not of the GPU kernels)'}",
          flush=True)
    for name in ("triton", "cupy"):
        if name not in available and device.type == "cuda":
            print(f"  {name} not run: {info.reason(name)}", flush=True)
    cases, mismatches = run(device, backends, args.verbose, (int(k) - 1, int(n)))
    print(f"{cases} cases, {mismatches} mismatches", flush=True)
    return 1 if mismatches or not cases else 0


# The compacted CSR (``create_compact_kv_indices``): request lengths, source starts and output offsets at the
# int32/int64 extremes (rows wholly outside ``out``, the first and last cut at its edges, none overlapping), source
# rows past the table, every step, offset, placeholder and cap; and its storage cases.
def compact_csr_hostile(device, backends):
    """Yields ``(what, launch, out, expected)`` per case."""
    g = torch.Generator().manual_seed(1)
    rows, cols = 4, 5 * 16 + 7
    batch = 7
    source_cpu = torch.randint(I32_MIN, I32_MAX, (rows, cols), generator=g, dtype=torch.int64).to(torch.int32)
    source_cpu[0, :3] = torch.tensor([I32_MIN, I32_MAX, -1], dtype=torch.int32)
    source = source_cpu.to(device)
    for backend, dtype, row_step, (offset, step), fill, cap, with_start in itertools.product(
            backends, (torch.int32, torch.int64), (0, 1, 3), ((0, 1), (2, 3)), (None, -1), (None, 5), (False, True)):
        info = torch.iinfo(dtype)
        window = -(-cols // step) + 1
        total = batch * window
        lens = torch.tensor([info.max, -1, 0, 3, info.min, cols + 5, 2 * cols], dtype=dtype)
        starts = torch.tensor([info.min, -1, 0, cols - 1, cols, info.max, 2], dtype=dtype)
        indptr = torch.arange(batch, dtype=torch.int64) * window
        indptr[0], indptr[-1] = -2, total - 2
        indptr[2], indptr[4] = info.max, info.min
        indptr = indptr.to(dtype)
        options = dict(row_step=row_step, source_indptr=starts.to(device) if with_start else None, offset=offset,
                       step=step, empty_fill=fill, max_count=cap)
        for out_dtype in (torch.int32, torch.int64):
            out = torch.full((total,), POISON, dtype=out_dtype, device=device)
            expected = out.cpu().clone()
            ops.compact_csr.reference(source_cpu, lens, indptr, expected, **dict(options, source_indptr=(
                starts if with_start else None)))
            what = (f"{backend} compact_csr {str(dtype)[6:]} row_step={row_step} offset={offset} step={step} "
                    f"fill={fill} cap={cap} start={with_start} out={str(out_dtype)[6:]}")
            yield what, lambda: kvdispatch.create_compact_kv_indices(
                source, lens.to(device), indptr.to(device), out, backend=backend, **options), out, expected


# The prefix+extend CSR (``create_prefix_extend_kv_indices``): lengths, starts, output offsets and the extend base
# at the int32/int64 extremes (rows wholly outside ``out``, the first and last cut at its edges, none overlapping);
# and its storage case.
def prefix_extend_hostile(device, backends):
    """Yields ``(what, launch, out, expected)`` per case."""
    g = torch.Generator().manual_seed(2)
    window = 40
    for backend, dtype, indptr_dtype, base in itertools.product(backends, (torch.int32, torch.int64),
                                                                (torch.int32, torch.int64), (0, I64_MAX, I64_MIN)):
        info, wide = torch.iinfo(dtype), torch.iinfo(indptr_dtype)
        # Only the rows outside out and the last (cut at out's end) are long: rows never overlap.
        prefix = torch.tensor([7, -1, info.max, 7, info.min, 30, info.max], dtype=dtype)
        extend = torch.tensor([5, 9, info.max, info.min, 2, 9, info.max], dtype=dtype)
        starts = torch.randint(info.min, info.max, (2, 7), generator=g, dtype=torch.int64).to(dtype)
        starts[:, 0] = info.max
        indptr = torch.arange(7, dtype=torch.int64) * window
        indptr[0], indptr[-1] = -2, 7 * window - 2
        indptr[2], indptr[4] = wide.max, wide.min
        indptr = indptr.to(indptr_dtype)
        for out_dtype in (torch.int32, torch.int64):
            out = torch.full((7 * window,), POISON, dtype=out_dtype, device=device)
            expected = out.cpu().clone()
            ops.prefix_extend_csr.reference(prefix, starts[0], extend, starts[1], indptr, expected, base)
            what = (f"{backend} prefix_extend_csr {str(dtype)[6:]} indptr={str(indptr_dtype)[6:]} base={base} "
                    f"out={str(out_dtype)[6:]}")
            vectors = [t.to(device) for t in (prefix, starts[0], extend, starts[1], indptr)]
            yield what, lambda: kvdispatch.create_prefix_extend_kv_indices(
                *vectors, out, extend_base=base, backend=backend), out, expected


# The DCP block table through a v2p (``create_dcp_page_table(v2p=...)``): slots at the int32 extremes (negative ones
# read page 0), v2p entries at the int64 extremes and freed, pages past v2p, an empty v2p; spoilt pool indices and
# lengths; and its storage case.
def dcp_table_v2p_hostile(device, backends):
    """Yields ``(what, launch, out, expected)`` per case."""
    g = torch.Generator().manual_seed(3)
    rows, cols = BATCH + 3, 5 * 16 * 3 + 7
    table = torch.randint(-5, 1 << 16, (rows, cols), generator=g, dtype=torch.int32)
    table[0, :6] = torch.tensor([I32_MIN, I32_MAX, -1, I32_MAX, I32_MIN, 0], dtype=torch.int32)
    for backend, dtype, (dcp_size, dcp_rank), page_size, v2p_size, fill in itertools.product(
            backends, (torch.int32, torch.int64), DCP_RANKS, (1, 16), (0, 3, 1 << 12), (None, -1)):
        info = torch.iinfo(dtype)
        pool = torch.tensor([0, rows - 1, -1, rows, info.max, info.min], dtype=dtype)
        lens = torch.tensor([cols, 5, 3, 3, 3, 3], dtype=dtype)
        lens[1] = info.max
        v2p = torch.randint(-1, 1 << 20, (v2p_size,), generator=g, dtype=torch.int64)
        v2p[: min(3, v2p_size)] = torch.tensor([I64_MAX, I64_MIN, -1])[: min(3, v2p_size)]
        out = torch.full((BATCH, 7), POISON, dtype=torch.int32, device=device)
        expected = out.cpu().clone()
        ops.dcp_page_table.reference(table, pool, lens, expected, page_size, dcp_size, dcp_rank, fill, False, v2p)
        what = (f"{backend} dcp_page_table v2p={v2p_size} page={page_size} dcp={dcp_size}/{dcp_rank} "
                f"{str(dtype)[6:]} fill={fill}")
        arguments = [t.to(device) for t in (table, pool, lens, v2p)]
        yield what, lambda: kvdispatch.create_dcp_page_table(
            *arguments[:3], out, page_size=page_size, dcp_size=dcp_size, dcp_rank=dcp_rank, fill_value=fill,
            v2p=arguments[3], backend=backend), out, expected


# Ops whose hostile cases are generators of (what, launch, out, expected), run after the others.
HOSTILE_OPS = (compact_csr_hostile, prefix_extend_hostile, dcp_table_v2p_hostile)


# -- the ragged CSR's block table, the MHA table's seqlen_offset, the prefill-aware table, the merged CSR, the
# speculative concat table ------------------------------------------------------------------------------------
# create_ragged_page_table: kv_indptr rows starting past kv_indices, at its last entry, negative, at the int32 and
# int64 extremes, decreasing (negative lengths), ending past the end; kv_indices entries negative and at the
# extremes; the lookups of hostile_mappings; page sizes 1, 64, 7. create_trtllm_mha_page_table with seqlen_offset
# at the int32 extremes on the spoilt lengths. create_prefill_aware_swa_table on the spoilt requests, with
# prefill lengths at the extremes or a prefill_lens shorter than the pool, windows of 0, 5 and 2**31 - 1.
# create_merged_kv_indices: the spoilt kv_indptr rows above as the prefix CSR, extend starts past the array,
# negative and at the extremes, lengths at int32's end, outs of 0, 40 and 200 entries, int32 and int64 outputs.
# create_spec_concat_page_table: prefix and expand lengths negative, past their tables and at the extremes.

def ragged_bounds(total, wide):
    """(name, kv_indptr values [BATCH + 1]) per case: consecutive valid rows, one spoilt bound among them."""
    lengths = [3, 40, 0, 17, 9, 22]
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    scale = max(1, total // (bounds[-1] + 1))
    bounds = [b * scale for b in bounds]
    extremes = [("start-past-end", total + 3), ("start-at-end", total), ("start-last-entry", total - 1),
                ("negative", -2), ("int32-max", I32_MAX), ("int32-min", I32_MIN)]
    if wide:
        extremes += [("int64-max", I64_MAX), ("int64-min", I64_MIN), ("2**62", 2**62)]
    yield "valid", bounds
    for name, value in extremes:
        for b in (0, 3, BATCH):  # the first start, a middle bound (an end and a start), the last end
            spoilt = list(bounds)
            spoilt[b] = value
            yield f"{name}@{b}", spoilt


def run_table_ops(device, backends, verbose, shard=(0, 1)):
    """The ragged page table's cases, the MHA table's seqlen_offset, the prefill-aware table's, the merged token
    CSR's and the speculative concat table's (``shard`` as for ``run``): their ``Tally``."""
    g = torch.Generator().manual_seed(1)
    tally = Tally(shard, verbose)

    def case(what, launch, reference, outs):
        """``reference`` writes the expected copies of the poisoned ``outs``, ``launch`` the ``outs``."""
        if not tally.selected():
            return
        expected = [out.cpu().clone() for out in outs]
        reference(expected)
        tally.launch_and_compare(what, launch, list(zip(outs, expected)))

    for backend in backends:
        for page_size, dtype in itertools.product(MAPPED_PAGE_SIZES, (torch.int32, torch.int64)):
            total = 5 * page_size + 7
            slots = torch.randint(0, I32_MAX, (total,), generator=g, dtype=torch.int64)
            slots[::7] = torch.tensor([-1, I32_MIN, I32_MAX] + ([I64_MIN, I64_MAX] if dtype == torch.int64 else []))[
                torch.arange(0, total, 7) % (5 if dtype == torch.int64 else 3)]
            kv_indices = slots.to(dtype).to(device)
            for (name, bounds), lookup, toward_zero in itertools.product(
                    ragged_bounds(total, dtype == torch.int64), hostile_mappings(page_size, device, g), (False, True)):
                kv_indptr = torch.tensor(bounds, dtype=dtype, device=device)
                outs = [torch.full((BATCH, width), POISON, dtype=torch.int32, device=device) for width in (5, 7)]
                swa = lookup is not None
                case(f"{backend} ragged_page_table page={page_size} {str(dtype)[6:]} {name} "
                     f"mapping={lookup.shape[0] if swa else None} toward_zero={toward_zero}",
                     lambda: kvdispatch.create_ragged_page_table(  # noqa: B023
                         kv_indices, kv_indptr, outs[0], page_size=page_size, swa_page_table=outs[1] if swa else None,
                         full_to_swa=lookup, round_toward_zero=toward_zero, backend=backend),
                     lambda expected: ops.ragged_page_table.reference(  # noqa: B023
                         kv_indices.cpu(), kv_indptr.cpu(), expected[0], page_size, expected[1] if swa else None,
                         lookup.cpu() if swa else None, toward_zero),
                     outs if swa else outs[:1])
            for spoil in hostile_requests(BATCH + 3, 5 * page_size + 7, dtype == torch.int64):
                if spoil[2] is None:
                    continue  # the offsets matter to the spoilt lengths
                data, rows, cols = make(page_size, dtype, device, g, spoil)
                cpu = {k: v.cpu() for k, v in data.items()}
                for offset in LENGTH_OFFSETS:
                    outs = [torch.full((BATCH, 5), POISON, dtype=torch.int32, device=device)]
                    case(f"{backend} mha_page_table page={page_size} {str(dtype)[6:]} {spoil[0]} "
                         f"seqlen_offset={offset}",
                         lambda: kvdispatch.create_trtllm_mha_page_table(  # noqa: B023
                             data["table"], data["pool"], data["lens"], outs[0], page_size=page_size,
                             seqlen_offset=offset, round_toward_zero=True, backend=backend),
                         lambda expected: ops.mha_page_table.reference(  # noqa: B023
                             cpu["table"], cpu["pool"], cpu["lens"], expected[0], page_size, None, None, True, offset),
                         outs)
        for dtype in (torch.int32, torch.int64):
            for spoil in hostile_requests(BATCH + 3, 5 * 16 + 7, dtype == torch.int64):
                if spoil[3] is not None:
                    continue  # no start positions
                data, rows, cols = make(16, dtype, device, g, spoil)
                cpu = {k: v.cpu() for k, v in data.items()}
                extremes = [I32_MAX, I32_MIN, -1, cols + 5] + ([I64_MAX, I64_MIN] if dtype == torch.int64 else [])
                for prefill_kind, window in itertools.product(("valid", "extreme", "short"), (0, 5, I32_MAX)):
                    prefill = torch.randint(0, cols, (rows,), generator=g)
                    if prefill_kind == "extreme":
                        prefill[cpu["pool"].clamp(0, rows - 1)[:2]] = torch.tensor(extremes[:2])
                        prefill[::3] = torch.tensor(extremes)[torch.arange(0, rows, 3) % len(extremes)]
                    elif prefill_kind == "short":
                        prefill = prefill[: rows // 2]  # pool indices past it read a prefill of 0
                    prefill = prefill.to(dtype).to(device)
                    outs = [torch.full((BATCH, 9), POISON, dtype=torch.int32, device=device),
                            torch.full((BATCH,), POISON, dtype=torch.int32, device=device)]
                    case(f"{backend} pa_swa_table {str(dtype)[6:]} {spoil[0]} prefill={prefill_kind} window={window}",
                         lambda: kvdispatch.create_prefill_aware_swa_table(  # noqa: B023
                             data["table"], data["pool"], data["lens"], prefill, outs[0], outs[1], window_size=window,
                             backend=backend),
                         lambda expected: ops.pa_swa_table.reference(  # noqa: B023
                             cpu["table"], cpu["pool"], cpu["lens"], prefill.cpu(), expected[0], expected[1], window),
                         outs)
        for dtype, out_dtype in itertools.product((torch.int32, torch.int64), (torch.int32, torch.int64)):
            prefix = torch.randint(I32_MIN, I32_MAX, (60,), generator=g).to(dtype).to(device)
            extend = torch.randint(I32_MIN, I32_MAX, (25,), generator=g).to(dtype).to(device)
            for (name, bounds), (start_name, starts), total in itertools.product(
                    ragged_bounds(60, dtype == torch.int64),
                    (("valid", [0, 5, 5, 9, 12, 20]), ("past", [0, 25, 24, -1, 3, I32_MAX]),
                     ("extreme", [I32_MIN, 2, 0, 20, 7, 1])), (0, 40, 200)):
                lengths = torch.tensor([5, 0, 4, 3, 8, I32_MAX if start_name == "extreme" else 4], dtype=dtype)
                args = (torch.tensor(bounds, dtype=dtype, device=device), prefix,
                        torch.tensor(starts, dtype=dtype, device=device), lengths.to(device), extend)
                outs = [torch.full((total,), POISON, dtype=out_dtype, device=device),
                        torch.full((BATCH + 2,), POISON, dtype=out_dtype, device=device)]
                case(f"{backend} merged_token_csr {str(dtype)[6:]} out={str(out_dtype)[6:]} {name} {start_name} "
                     f"total={total}",
                     lambda: kvdispatch.create_merged_kv_indices(*args, outs[1], outs[0],  # noqa: B023
                                                                 backend=backend),
                     lambda expected: ops.merged_token_csr.reference(  # noqa: B023
                         *(a.cpu() for a in args), expected[1], expected[0]),
                     outs)
        for dtype, draft in itertools.product((torch.int32, torch.int64), (1, 3)):
            extremes = [I32_MAX, I32_MIN, -1, 0, 40, 41] + ([I64_MAX, I64_MIN, 2**62] if dtype == torch.int64 else [])
            for spoilt in range(len(extremes)):
                table_a = torch.randint(I32_MIN, I32_MAX, (BATCH, 40), generator=g, dtype=torch.int64).to(torch.int32)
                table_b = torch.randint(I32_MIN, I32_MAX, (BATCH * draft, 6), generator=g, dtype=torch.int64)
                lens_a = torch.randint(0, 41, (BATCH,), generator=g)
                lens_b = torch.randint(0, 7, (BATCH * draft,), generator=g)
                lens_a[spoilt % BATCH] = extremes[spoilt]
                lens_b[-1 - spoilt % BATCH] = extremes[-1 - spoilt]
                args = (table_a.to(device), table_b.to(torch.int32).to(device), lens_a.to(dtype).to(device),
                        lens_b.to(dtype).to(device))
                outs = [torch.full((BATCH * draft, 44), POISON, dtype=torch.int32, device=device)]
                case(f"{backend} spec_concat_page_table {str(dtype)[6:]} draft={draft} spoilt={spoilt}",
                     lambda: kvdispatch.create_spec_concat_page_table(*args, outs[0], draft_tokens=draft,  # noqa: B023
                                                                      backend=backend),
                     lambda expected: ops.spec_concat_page_table.reference(  # noqa: B023
                         *(a.cpu() for a in args), expected[0], draft),
                     outs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return tally


if __name__ == "__main__":
    sys.exit(main())
