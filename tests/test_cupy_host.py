"""The CUDA/HIP source built for the host, on the cases that pick its code paths: every 16-byte alignment
of source and destination (wide or scalar copies), negative slots, fills, mixed index dtypes, width 0.
"""

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cuda_host as host
from kvcases import POISON, Case, loop_token_csr
from kvdispatch import ops
from kvdispatch import grid


@pytest.fixture(scope="module", autouse=True)
def _host_library():
    try:
        host.library()
    except host.CompilerMissing as exc:  # a build that fails fails the tests
        pytest.skip(str(exc))


def _table(rows, cols, stride, negative=False):
    store = torch.full((rows, stride), POISON, dtype=torch.int32)
    values = torch.randperm(rows * cols * 3)[: rows * cols].view(rows, cols).to(torch.int32) + 1
    store[:, :cols] = -values if negative else values
    return store[:, :cols]


def _poisoned(rows, width, stride):
    return torch.full((rows, stride), POISON, dtype=torch.int32)[:, :width]


# Both builds: the generic kernels (runtime page size and flags) and the specialisation the GPU launcher
# compiles for the call (KV_PAGE_SIZE, KV_FLAGS).
BUILDS = pytest.mark.parametrize("specialised", (False, True), ids=("generic", "specialised"))


@BUILDS
@pytest.mark.representative("page_size", "shift")
@pytest.mark.parametrize("page_size", (1, 3, 64))
@pytest.mark.parametrize("shift", range(4))
@pytest.mark.parametrize("round_toward_zero", (False, True))
def test_page_table_alignments(page_size, shift, round_toward_zero, specialised):
    """Starts and strides move source and destination through every 4-byte phase of a 16-byte line; odd
    shifts take negative slots, divided rounding down or toward zero."""
    rng = random.Random(page_size * 10 + shift)
    items = grid.items_per_program(grid.PAGE_TABLE, page_size)
    batch, cols = 9, (2 * items + 7) * page_size + 8
    table = _table(batch + 2, cols, cols + rng.randrange(0, 4), negative=shift % 2 == 1)
    pool = torch.randperm(batch + 2)[:batch]
    start = torch.tensor([rng.randrange(0, 8) for _ in range(batch)])
    lengths = torch.tensor([rng.randrange(-3, cols) for _ in range(batch)])
    for fill in (None, -7):
        out = _poisoned(batch + 1, 2 * items + 3, 2 * items + 3 + shift)
        expected = out.clone()
        ops.page_table.reference(table, pool, lengths, expected, page_size, start, 0, None, fill,
                                   round_toward_zero)
        host.create_flashmla_kv_indices(table, pool, lengths, out, page_size=page_size, kv_start_idx=start,
                                        fill_value=fill, round_toward_zero=round_toward_zero,
                                        specialised=specialised)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)


@BUILDS
@pytest.mark.parametrize("dtypes", [(torch.int32, torch.int64, torch.int32), (torch.int64, torch.int32, torch.int64)])
def test_mixed_index_dtypes_and_seq_lens_out(dtypes, specialised):
    pool_dtype, lens_dtype, start_dtype = dtypes
    table = _table(6, 200, 203)
    pool = torch.tensor([3, 0, 5, 1], dtype=pool_dtype)
    lengths = torch.tensor([10, 150, 1, 0], dtype=lens_dtype)
    start = torch.tensor([0, 5, 7, 2], dtype=start_dtype)
    out, seq_out = _poisoned(5, 20, 23), torch.full((6,), POISON, dtype=torch.int32)
    expected, expected_seq = out.clone(), seq_out.clone()
    ops.page_table.reference(table, pool, lengths, expected, 8, start, 2, expected_seq, None)
    host.create_flashmla_kv_indices(table, pool, lengths, out, page_size=8, kv_start_idx=start, seqlen_offset=2,
                                    seq_lens_out=seq_out, specialised=specialised)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(seq_out, expected_seq, rtol=0, atol=0)


def test_width_zero_still_writes_seq_lens_out():
    table, pool, lengths = _table(3, 16, 16), torch.tensor([0, 2]), torch.tensor([5, 9])
    out, seq_out = torch.empty((2, 0), dtype=torch.int32), torch.full((3,), POISON, dtype=torch.int32)
    host.create_flashmla_kv_indices(table, pool, lengths, out, page_size=4, seqlen_offset=-1, seq_lens_out=seq_out)
    assert seq_out.tolist() == [4, 8, POISON]


@BUILDS
@pytest.mark.parametrize("shift", range(4))
def test_token_csr_alignments(shift, specialised):
    """Row offsets in ``out`` at every phase against the table's, and rows cut by both ends of ``out``."""
    rng = random.Random(shift)
    tokens = grid.items_per_program(grid.TOKEN_CSR)
    batch, cols = 7, 2 * tokens + 50
    table = _table(batch + 1, cols, cols + shift)
    pool = torch.randperm(batch + 1)[:batch]
    lengths = torch.tensor([rng.randrange(0, cols) for _ in range(batch)])
    start = torch.tensor([rng.randrange(0, 9) for _ in range(batch)])
    # Rows do not overlap; the first starts before out, the last runs past its end.
    offsets = [-37]
    for length in lengths.tolist():
        offsets.append(offsets[-1] + max(length, 0) + rng.randrange(0, 6))
    indptr = torch.tensor(offsets)
    out = torch.full((offsets[-2] + int(lengths[-1]) // 2 + shift,), POISON, dtype=torch.int32)
    expected = out.clone()
    ops.token_csr.reference(table, pool, lengths, indptr, expected, start)
    host.create_flashinfer_kv_indices(table, pool, lengths, indptr, out, kv_start_idx=start, specialised=specialised)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_token_csr_huge_pointers_write_nothing():
    table, pool, lengths = _table(2, 40, 40), torch.tensor([0, 1]), torch.tensor([30, 30])
    out = torch.full((50,), POISON, dtype=torch.int32)
    indptr = torch.tensor([2**62, -(2**63)], dtype=torch.int64)
    host.create_flashinfer_kv_indices(table, pool, lengths, indptr, out)
    assert (out == POISON).all()


def test_import_does_not_import_cupy():
    code = "import sys, kernels_cupy, cuda_host; assert 'cupy' not in sys.modules, 'cupy imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent)


def test_token_csr_row_starting_before_a_short_out():
    """kv_indptr[b] < 0 and out shorter than the table: tokens -kv_indptr[b] onwards land in out (the
    contract's loop; kvdispatch.reference only looks at tokens below min(C, len(out)) and misses them)."""
    table, pool = _table(3, 50, 50), torch.tensor([1, 2])
    lengths, start, indptr = torch.tensor([40, 5]), torch.tensor([3, 0]), torch.tensor([-30, 4, 9])
    out = torch.full((6,), POISON, dtype=torch.int32)
    expected = loop_token_csr(Case(table, pool, lengths, 1, 0, kv_start_idx=start), indptr, out)
    host.create_flashinfer_kv_indices(table, pool, lengths, indptr, out, kv_start_idx=start)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("op", ("page_table", "token_csr"))
def test_strided_index_vectors(op):
    table = _table(6, 64, 64)
    vectors = [torch.tensor([4, 0, 5, 2]), torch.tensor([64, 17, 3, 40], dtype=torch.int32),
               torch.tensor([0, 5, 60, 9]), torch.tensor([0, 70, 90, 100, 150])]
    strided = [torch.stack([v, torch.full_like(v, -999)], 1).flatten()[::2] for v in vectors]
    pool, lengths, start, indptr = strided
    if op == "page_table":
        out, expected = _poisoned(4, 17, 17), _poisoned(4, 17, 17)
        ops.page_table.reference(table, vectors[0], vectors[1], expected, 4, vectors[2])
        host.create_flashmla_kv_indices(table, pool, lengths, out, page_size=4, kv_start_idx=start)
    else:
        out = torch.full((160,), POISON, dtype=torch.int32)
        expected = out.clone()
        ops.token_csr.reference(table, vectors[0], vectors[1], vectors[3], expected, vectors[2])
        host.create_flashinfer_kv_indices(table, pool, lengths, indptr, out, kv_start_idx=start)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
