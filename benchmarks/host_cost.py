"""Where the host time of one public-API call goes, on a GPU: each layer timed alone, same run.

    PYTHONPATH=. python3 benchmarks/host_cost.py [--backend triton]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

# The test suite's case builder (tests/ is a folder of modules, not a package).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from kvdispatch import ops
import kvdispatch  # noqa: E402
from kvcases import make_case  # noqa: E402
from kvdispatch import _debug, dispatch  # noqa: E402


def host_us(fn, calls=2000, batches=7):
    times = []
    for _ in range(batches):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def host_case(backend="triton"):
    """The host-cost case (batch 64, page 64, up to 512 pages, int32 vectors, no options) on cuda: the
    public API's four positional arguments, after one call through ``backend``, and what that call wrote."""
    case = make_case(64, 64, max_pages=512, device="cuda")
    out = case.page_table_out()
    args = (case.req_to_token, case.req_pool_indices, case.seq_lens, out)
    out.fill_(-7)
    kvdispatch.create_flashmla_kv_indices(*args, page_size=64, backend=backend)
    torch.cuda.synchronize()
    return args, out.clone()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="triton")
    backend = parser.parse_args().backend
    args, _ = host_case(backend)
    out = args[3]
    api = kvdispatch.create_flashmla_kv_indices
    name, build = dispatch.selector.resolve(out.device, "page_table", backend)
    full = (*args, 64, None, 0, None, None)
    x = torch.zeros(16, device="cuda")
    case = make_case(64, 64, max_pages=512, device="cuda")
    indptr, csr_out = case.csr()
    csr_args = (case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, csr_out)
    kvdispatch.create_flashinfer_kv_indices(*csr_args, backend=backend)
    rows = [
        ("x.add_(1)", lambda: x.add_(1)),
        ("public API", lambda: api(*args, page_size=64, backend=backend)),
        ("public API, token CSR", lambda: kvdispatch.create_flashinfer_kv_indices(*csr_args, backend=backend)),
        ("validation only", lambda: ops.page_table.check_arguments(*full)),
        ("debug switch read", _debug.enabled),
        ("selection lookup", lambda: dispatch.selector.resolve(out.device, "page_table", backend)),
        (f"{name} build_page_table", lambda: build(*full)),
        ("raw stream query", lambda: torch._C._cuda_getCurrentRawStream(0)),
        ("torch.cuda.current_stream()", torch.cuda.current_stream),
    ]
    for label, fn in rows:
        print(f"{label:32} {host_us(fn):7.2f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
