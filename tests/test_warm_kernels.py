"""ci/warm_kernels.py: what it enumerates is what the GPU fuzz can reach, and every call it makes is valid."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ci"))
import warm_kernels  # noqa: E402
from test_fuzz import COMPILED_PAGE_SIZES  # noqa: E402


def test_every_reachable_specialisation_once():
    page_table = list(warm_kernels.page_table_options())
    token_csr = list(warm_kernels.token_csr_options())
    # page size x (no start: seq_lens_out, fill, offset, 2 dtypes) + (start: the same, 3 dtypes)
    assert len(page_table) == len(set(page_table)) == len(COMPILED_PAGE_SIZES) * (2 * 2 * 2 * 4 + 2 * 2 * 2 * 8)
    assert {o[0] for o in page_table} == set(COMPILED_PAGE_SIZES)
    assert len(token_csr) == len(set(token_csr)) == 8 + 16


def test_every_call_is_accepted_by_the_api():
    """The torch backend on CPU takes every call the script makes on a GPU (same arguments, same checks)."""
    done = [warm_kernels.warm(task) for task in warm_kernels.tasks(["torch"], ["page_table", "token_csr"],
                                                                    torch.device("cpu"))]
    assert done.count(("torch", "page_table")) == len(list(warm_kernels.page_table_options()))
    assert done.count(("torch", "token_csr")) == len(list(warm_kernels.token_csr_options()))
