"""The compiled host path's replay entry (``host_path.c``'s ``replay``) on CPU, for both launchers, without a GPU.

The extension is pointed at stubs (``host_path_stubs``; CPU is device 0 there). For each op (``host_path.REPLAYED``:
every op, with every option) and each launcher, a call A goes the backend's Python path with its launch
recorded (``host_path.call_and_register``); a call B with the same metadata and ints but other tensors is
then replayed by C, which must launch exactly what the Python path launches for B (parameters, grid,
threads, shared memory). CuPy's Python path runs with its runtime replaced by a recorder; Triton's with
its plans replaced by ones that record instead of launching, over a compiled kernel described as Triton
describes one (its signature: constexprs and None arguments are no parameters). A call that differs in
any metadata or int is handed back, and so is one whose output shares memory with another argument,
exactly where the validator would refuse it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools

import pytest
import torch

import kernels_cupy
import kvdispatch
from host_path_stubs import CONTEXT, FUNCTION, STREAM_BASE, build, install, sibling, siblings, unsigned
from kernels_cupy import launch as cupy_launch
from kernels_cupy import native as cupy_native
from kvdispatch import _debug, _validate, dispatch, host_path

triton = pytest.importorskip("triton")
import kernels_triton  # noqa: E402
from kernels_triton import launch as triton_launch  # noqa: E402
from kernels_triton import mapped_tables  # noqa: E402

OPS = tuple(host_path.REPLAYED)
LAUNCHERS = ("cupy", "triton")
TRITON_THREADS, TRITON_SHARED = 128, 24
# Every launcher of the Triton kernel modules that launch the ops (their plans are the stubs' recorders).
TRITON_KERNEL_LAUNCHERS = list({id(value): value for module in
                                {importlib.import_module(f"kernels_triton.{name}") for name, _ in
                                 kernels_triton.KERNELS.values()}
                                for value in vars(module).values()
                                if isinstance(value, triton_launch.KernelLauncher)}.values())


def python_check(op, args):
    """The op's validator on ``args`` (public arguments, replay order)."""
    declared = dispatch.OPS[op]
    return declared.check(**dict(zip(declared.parameters, args)))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(tmp_path_factory)


class Recorder:
    """What the backends' Python paths launched (CuPy's ``KernelCall``s, Triton's ``host_path.Launch``es)."""

    def __init__(self):
        self.launched = []

    def launch(self, call, device):  # kernels_cupy.runtime.launch
        self.launched.append(call)


@pytest.fixture
def stubs(built, monkeypatch):
    """The extension with stubs as ``host_path``'s module; CuPy's runtime and Triton's plans replaced by
    recorders (``stubs.recorder``); every launch plan forgotten before and after."""
    stubs = install(built, monkeypatch, count=0)
    monkeypatch.delenv(cupy_native.LAUNCH_ENV, raising=False)
    monkeypatch.delenv(triton_launch.LAUNCH_ENV, raising=False)
    monkeypatch.setattr(cupy_native, "kernel_and_context", lambda index, call: (FUNCTION, stubs.context))
    stubs.recorder = recorder = Recorder()
    monkeypatch.setattr(cupy_launch, "_runtime_module", recorder)
    for launcher in TRITON_KERNEL_LAUNCHERS:
        monkeypatch.setattr(launcher, "plan", functools.partial(_recording_plan, launcher, recorder))
        monkeypatch.setattr(launcher, "compiled", {})
        monkeypatch.setattr(launcher, "native_kernels", {})
    triton_launch.reset()
    yield stubs
    triton_launch.reset()


def _recording_plan(launcher, recorder, device_index, specialisation, grid, constexprs, num_warps, first_args):
    """``KernelLauncher.plan`` on device 0 (CPU here) over a compiled kernel described as Triton describes one,
    whose launches are recorded (as ``replay_launch`` describes them), not run."""
    key = (0, specialisation)
    signature = {name: "constexpr" if value is None else "i64" for name, value in
                 zip(launcher.arg_names, first_args)}
    signature.update({name: "constexpr" for name in launcher.constexpr_names})
    launcher.compiled[key] = type("Compiled", (), {"src": type("Source", (), {"signature": signature})()})()
    count = sum(kind != "constexpr" for kind in signature.values()) + 2
    launcher.native_kernels[key] = triton_launch.NativeKernel(FUNCTION, TRITON_THREADS, TRITON_SHARED, count,
                                                              CONTEXT)

    def launch(*args):
        recorder.launched.append(launcher.replay_launch(0, specialisation, grid, args))

    launch.describe = functools.partial(launcher.replay_launch, 0, specialisation, grid)
    return launch, False


def python_path(stubs, op, launcher, args, register=True):
    """Run ``args`` (public arguments, replay order) through ``launcher``'s Python path, registering the replay
    plan when ``register``; returns what it launched: ``(params as 64-bit words, grid, threads, shared)``,
    or None when it launched nothing."""
    stubs.recorder.launched.clear()
    if launcher == "cupy":
        run = functools.partial(kernels_cupy.kernel(op), *args)
    else:
        run = functools.partial(kernels_triton.kernel(op), *args, pdl=False)
    if register:
        host_path.call_and_register(op, None, args, run)
    else:
        run()
    if not stubs.recorder.launched:
        return None
    (launched,) = stubs.recorder.launched
    if launcher == "cupy":
        return unsigned(launched.args), launched.grid, launched.threads, 0
    return unsigned(launched.params), launched.grid, launched.threads, launched.shared


def replayed(stubs, op, args):
    """The replay entry's answer for ``args`` (the first output, or NotImplemented)."""
    return stubs.module.replay(host_path.OPS[op], None, *args)


def assert_replays_as_python(stubs, op, launcher, args):
    """C launches for ``args`` exactly what the Python path launches for them."""
    params, grid, threads, shared = python_path(stubs, op, launcher, args, register=False)
    stubs.count = len(params)
    before = stubs.module.launch_count()
    stubs.launches.clear()
    result = replayed(stubs, op, args)
    assert result is args[host_path.REPLAYED[op][0]]
    (launch,) = stubs.launches
    assert launch["grid"] == tuple(grid) and launch["block"] == (threads, 1, 1) and launch["shared"] == shared
    assert launch["function"] == FUNCTION and launch["stream"] == STREAM_BASE and not launch["extra"]
    assert stubs.module.launch_count() == before + 1
    return launch, params


# ---- random and hostile calls ------------------------------------------------------------------------------


class Draw:
    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def int(self, low, high):
        return int(torch.randint(low, high, (1,), generator=self.g))

    def pick(self, choices):
        return choices[self.int(0, len(choices))]

    def table(self, rows, cols):
        return torch.randint(-5, 1 << 20, (rows, cols + self.pick((0, 3))), generator=self.g,
                             dtype=torch.int32)[:, :cols]

    def vector(self, low, high, length, dtype=None, strided=None):
        dtype = dtype or self.pick((torch.int32, torch.int64))
        step = 2 if (self.pick((False, True)) if strided is None else strided) else 1
        return torch.randint(low, high, (length * step,), generator=self.g).to(dtype)[::step]

    def out(self, rows, width, dtype=torch.int32):
        out = torch.randint(-9, 9, (rows + self.pick((0, 2)), width + self.pick((0, 5))), generator=self.g).to(dtype)
        return out[:, :width] if self.pick((False, True)) else out

    def common(self):
        rows, cols, batch = self.int(2, 40), self.int(1, 300), self.int(1, 9)
        return rows, cols, batch, self.table(rows, cols), self.vector(-1, rows + 1, batch), \
            self.vector(-3, cols + 5, batch)


def random_args(op, seed):
    """The public arguments (replay order) of a random valid call of ``op``: int32/int64 and strided vectors,
    every option of the op."""
    d = Draw(seed)
    rows, cols, batch, table, pool, lens = d.common()
    if op == "page_table":
        return [table, pool, lens, d.out(batch, d.int(1, 50)), d.pick((1, 16, 64, 96, 4096)),
                d.pick((None, d.vector(-1, cols, batch))), d.pick((0, 0, 3, -2)),
                d.pick((None, torch.zeros(batch + d.pick((0, 1)), dtype=torch.int32))),
                d.pick((None, d.int(-100, 100))), d.pick((False, True))]
    if op == "token_csr":
        total = d.int(1, 900)
        args = [table, pool, lens, d.vector(-5, total, batch + 1),
                torch.zeros(total, dtype=d.pick((torch.int32, torch.int64))), d.pick((None, d.vector(0, cols, batch))),
                d.pick((1, 1, 16, 3)), d.pick((None, d.vector(-3, 2000, d.int(1, 40), strided=False)))]
        translated = args[6] == 1 and args[7] is None and d.pick((False, True))  # v2p: the packed read stream
        return args + ([d.vector(-1, 2000, d.int(1, 40), strided=False), d.pick((1, 16, 24))] if translated
                       else [None, 1])
    if op == "draft_decode":
        steps, topk = d.int(1, 5), d.int(1, 4)
        segments = batch * topk
        out_dtype, indptr_dtype = d.pick((torch.int32, torch.int64)), d.pick((torch.int32, torch.int64))
        window = d.pick((0, 0, 7))
        return [table, pool, lens, d.out(steps, segments + 1, indptr_dtype), d.out(steps, d.int(1, 600), out_dtype),
                steps, topk, d.pick((1, 16, 64)),
                d.pick((None, d.vector(0, cols, segments + d.pick((0, 2))))), window, d.pick((0, 3)) if window else 0,
                d.pick((None, d.vector(-1, 50, d.int(1, 40), strided=False))), d.pick((True, False)),
                d.pick((False, True))]
    if op == "dcp_token_csr":
        size = d.pick((1, 2, 4, 3))
        total = d.int(1, 900)
        return [table, pool, lens, d.vector(-5, total, batch + 1), torch.zeros(total,
                dtype=d.pick((torch.int32, torch.int64))), size, d.int(0, size),
                d.pick((None, d.vector(0, cols, batch))), d.pick((False, True))]
    if op == "dcp_page_table":
        size = d.pick((1, 2, 4, 3))
        return [table, pool, lens, d.out(batch, d.int(1, 50)), d.pick((1, 16, 64, 96)), size, d.int(0, size),
                d.pick((None, d.int(-100, 100))), d.pick((False, True))]
    if op == "mha_page_table":
        swa = d.pick((False, True))
        return [table, pool, lens, d.out(batch, d.int(1, 50)), d.pick((1, 16, 64, 96)),
                d.out(batch, d.int(1, 50)) if swa else None,
                d.vector(-3, 1000, d.pick((0, 1, 30)), strided=False) if swa else None, d.pick((False, True)),
                d.pick((0, 0, 4, -3))]
    if op == "spec_concat_page_table":
        draft = d.pick((1, 2, 4))
        return [table[:batch] if rows >= batch else d.table(batch, cols), d.table(batch * draft, d.int(1, 9)),
                d.vector(-3, cols + 5, batch), d.vector(-2, 10, batch * draft), d.out(batch * draft, d.int(1, 60)),
                draft]
    if op == "merged_token_csr":
        prefix_count, extend_count = d.int(0, 400), d.int(0, 100)
        return [d.vector(-2, prefix_count + 3, batch + 1), d.vector(-5, 1 << 20, prefix_count, strided=False),
                d.vector(-1, extend_count + 2, batch), d.vector(-2, 30, batch),
                d.vector(-5, 1 << 20, extend_count, strided=False),
                torch.zeros(batch + 1 + d.pick((0, 2)), dtype=d.pick((torch.int32, torch.int64))),
                torch.zeros(d.int(0, 600), dtype=d.pick((torch.int32, torch.int64)))]
    if op == "pa_swa_table":
        return [table, pool, lens, d.vector(-3, cols, rows + d.pick((0, 2)), strided=False), d.out(batch, d.int(1, 50)),
                torch.zeros(batch + d.pick((0, 1)), dtype=torch.int32), d.pick((0, 7, 64))]
    if op == "ragged_page_table":
        swa, total = d.pick((False, True)), d.int(1, 900)
        return [d.vector(-5, 1 << 20, total, strided=False), d.vector(-5, total + 5, batch + 1),
                d.out(batch, d.int(1, 50)), d.pick((1, 16, 64, 96)), d.out(batch, d.int(1, 50)) if swa else None,
                d.vector(-3, 1000, d.pick((0, 1, 30)), strided=False) if swa else None, d.pick((False, True))]
    if op == "decode_metadata":
        def sums():
            return torch.zeros(batch + d.pick((0, 1)), dtype=torch.int32)

        swa, locs, q = d.pick((False, True)), d.pick((False, True)), d.pick((None, "lens", "stride"))
        mapping = d.vector(-3, 1000, d.pick((0, 1, 30)), strided=False)
        return [table, pool, lens, torch.zeros(batch + d.pick((0, 2)), dtype=torch.int32), sums(),
                d.pick((1, 16, 64, 96)), d.pick((0, 3, -2)), d.out(batch, d.int(1, 50)),
                d.out(batch, d.int(1, 50)) if swa else None, mapping if swa or locs else None,
                d.pick((None, d.vector(-1, 50, d.int(1, 40), strided=False))),
                d.vector(-1, 50, d.int(1, 40), strided=False) if swa and d.pick((False, True)) else None,
                d.pick((False, True)), sums() if q else None, d.vector(-2, 9, batch) if q == "lens" else None,
                d.int(-5, 9) if q == "stride" else None, d.vector(-3, 1000, d.int(0, 20)) if locs else None,
                torch.zeros(d.int(0, 30), dtype=d.pick((torch.int32, torch.int64))) if locs else None]
    if op == "cache_locs":  # req_to_token, pool, start, out, end, width, positions_out, page_size, maps, outs
        total, packed, maps = d.int(1, 600), d.pick((False, True)), d.pick((0, 1, 2))

        def output():
            return torch.zeros(total, dtype=d.pick((torch.int32, torch.int64)))
        translations = [(d.vector(-1, 50, d.int(1, 40), strided=False), output()) if k < maps else (None, None)
                        for k in range(2)]
        return [d.pick((table, table.long())), pool, lens, output(), d.vector(-3, cols + 5, batch) if packed else None,
                None if packed else d.int(0, 40), d.pick((None, output())), d.pick((1, 16, 64)),
                *translations[0], *translations[1]]
    if op == "compact_draft_rows":  # target, pool (distinct rows), suffix_start, prefix lens, verify, draft
        draft = d.out(rows + d.pick((0, 2)), d.int(1, 60), d.pick((torch.int32, torch.int64)))
        width = d.int(0, 9)
        pool = torch.randperm(max(rows, batch) + 1, generator=d.g)[:batch].to(d.pick((torch.int32, torch.int64)))
        return [table, pool, d.vector(-3, cols, batch), lens, d.out(batch, width, torch.int64)[:batch], draft]
    out = d.out(batch, d.int(1, 50))
    return [table, pool, lens, d.vector(-3, 1000, d.int(1, 40), strided=False), out, d.pick((1, 16, 64, 96)),
            d.pick((1, 1, 3, -2)), d.pick((None, d.int(1, out.shape[1] + 1))), d.pick((0, 0, 5, -4)),
            d.pick((None, None, 0, -3))]


# Where an op has packed 32-bit words (Triton: WIDE_INDEXING past them), sizes and strides at the edge.
INT_EDGES = {"page_table": {6: (2**31 - 1, -(2**31)), 8: (2**31 - 1, -(2**31))}, "token_csr": {6: (4096, 1)},
             "dcp_page_table": {7: (2**31 - 1, -(2**31))}, "translated_page_table": {6: (2**31 - 1, -(2**31)),
                                                                                     8: (2**31 - 1, -(2**31))}}


def hostile_args(op, seed, kind):
    """A random call of ``op`` changed as ``kind`` says: a table of 2**31 rows or rows 2**31 apart (no memory
    behind them), stride-0 vectors, ints at the int32 edges."""
    args = random_args(op, seed)
    if op == "ragged_page_table":
        return _ragged_hostile_args(args, kind)
    if op == "spec_concat_page_table":
        if kind == "pool stride 0":
            args[3] = args[3][:1].expand(args[3].shape[0])
        return args
    if op == "merged_token_csr":
        if kind == "pool stride 0":
            args[2] = args[2][:1].expand(args[2].shape[0])
        return args
    cols, batch = args[0].shape[1], args[1].shape[0]
    if kind == "table rows 2**31":
        args[0] = args[0][:1].expand(2**31, cols)
    elif kind == "table rows below":
        args[0] = args[0][:1].expand(2**31 - 1, cols)
    elif kind == "table row stride 2**31":
        args[0] = args[0][:1].as_strided((1, cols), (2**31, 1))
    elif kind == "pool stride 0":
        args[1] = args[1][:1].expand(batch)
    elif kind == "int edges":
        for index, (high, low) in INT_EDGES.get(op, {}).items():
            args[index] = high if seed % 2 else low
    elif kind == "out past 2**31" and op in OUT_TABLES:  # a one-row table whose row stride is 2**31
        index = OUT_TABLES[op]
        args[index] = torch.zeros(args[index].shape[1], dtype=args[index].dtype).as_strided(
            (1, args[index].shape[1]), (2**31, 1))
        for vector in (1, 2):
            args[vector] = args[vector][:1]
    elif kind == "out past 2**31" and op in ("dcp_token_csr", "token_csr"):  # an out of 2**31 entries
        args[4] = args[4][:1].expand(2**31)
    elif kind == "map past 2**31" and op in MAPS and args[MAPS[op]] is not None:
        args[MAPS[op]] = args[MAPS[op]][:1].expand(2**31)
    return args


def _ragged_hostile_args(args, kind):
    """``hostile_args`` for the ragged page table (a token CSR's: no table, and a 1-D contiguous ``kv_indices`` and
    ``full_to_swa`` cannot be 2**31 long without the memory): a stride-0 ``kv_indptr``, a table row stride of 2**31;
    the other kinds leave the random call as it is."""
    if kind == "pool stride 0":
        args[1] = args[1][:1].expand(args[1].shape[0])
    elif kind == "out past 2**31":
        args[2] = torch.zeros(args[2].shape[1], dtype=torch.int32).as_strided((1, args[2].shape[1]), (2**31, 1))
        args[1] = args[1][:2]
        args[4] = None if args[4] is None else args[4][:1]
    return args


# The ops' 2-D outputs of one row per request, and their lookup tables.
OUT_TABLES = {"page_table": 3, "dcp_page_table": 3, "mha_page_table": 3, "translated_page_table": 4}
MAPS = {"token_csr": 7, "mha_page_table": 6, "translated_page_table": 3}
HOSTILE = ("table rows 2**31", "table rows below", "table row stride 2**31", "pool stride 0", "int edges",
           "out past 2**31", "map past 2**31")


def approve(stubs, op, launcher):
    stubs.module.approve(host_path.OPS[op], 0, None, host_path.LAUNCHERS[launcher])


# ---- tests --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("seed", range(7 + 2 * len(HOSTILE)))
def test_replays_what_the_python_path_launches(stubs, op, launcher, seed):
    first = random_args(op, seed)
    if seed >= 7:
        first = hostile_args(op, seed, HOSTILE[seed % len(HOSTILE)])
    approve(stubs, op, launcher)
    assert python_path(stubs, op, launcher, first) is not None
    assert stubs.module.replay_plan_count() == 1
    second = siblings(first)
    launch, params = assert_replays_as_python(stubs, op, launcher, second)
    assert launch["params"] == params
    assert_replays_as_python(stubs, op, launcher, first)  # the registering call's own tensors too


def _mutations(op, args):
    """Calls differing from ``args`` in one thing each: an int, an int's or a flag's type (an equal bool, int
    or float), a dtype, a stride, a shape, the alignment, None for a tensor or a tensor for None."""
    for index, value in enumerate(args):
        changed = list(args)
        if type(value) is bool:
            changed[index] = not value
            yield f"{index} as an int", _replaced(list(args), index, int(value))  # what Python refuses, C too
        elif type(value) is int:
            changed[index] = value + 1
            if value in (0, 1):
                yield f"{index} as a bool", _replaced(list(args), index, bool(value))
            yield f"{index} as a float", _replaced(list(args), index, float(value))
        elif isinstance(value, torch.Tensor):
            other = torch.int64 if value.dtype == torch.int32 else torch.int32
            yield f"{index} dtype", _replaced(changed, index, sibling(value).to(other))
            wider = torch.zeros(*value.shape[:-1], value.shape[-1] + 1, dtype=value.dtype)
            yield f"{index} shape", _replaced(list(args), index, wider[..., :-1] if value.dim() == 2 and
                                              value.shape[0] > 1 else wider)
            if value.dim() == 1 and value.shape[0] > 0:
                spread = torch.zeros(2 * value.shape[0], dtype=value.dtype)[::2]
                yield f"{index} stride", _replaced(list(args), index, spread if value.stride(0) == 1 else
                                                   spread.contiguous()[: value.shape[0]])
            misaligned = torch.zeros(value.numel() + 8, dtype=value.dtype)[1:1 + value.numel()]
            if value.is_contiguous() and value.numel():
                yield f"{index} alignment", _replaced(list(args), index, misaligned.view(value.shape))
            continue
        elif value is None:
            changed[index] = torch.zeros(4, dtype=torch.int32)
        else:
            continue
        yield f"{index} value", changed


def _replaced(args, index, value):
    args[index] = value
    return args


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("op", OPS)
def test_hands_back_a_call_of_another_key(stubs, op, launcher):
    args = random_args(op, 101)
    approve(stubs, op, launcher)
    python_path(stubs, op, launcher, args)
    count = 0
    for name, changed in _mutations(op, siblings(args)):
        assert replayed(stubs, op, changed) is NotImplemented, name
        count += 1
    assert count >= 10 and not stubs.launches
    assert replayed(stubs, op, siblings(args)) is not NotImplemented


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("op", OPS)
def test_hands_back_a_tensor_its_memory_does_not_hold(stubs, op, launcher):
    """A call of the registered key with one tensor whose storage was released, or is one element short of its
    view: C launches nothing (the validator refuses it)."""
    args = random_args(op, 404)
    approve(stubs, op, launcher)
    python_path(stubs, op, launcher, args)
    for index in [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.numel()]:
        for held in ("released", "short"):
            call = siblings(args)
            t = call[index]
            end = (t.storage_offset() + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()
            t.untyped_storage().resize_(0 if held == "released" else end - t.element_size())
            assert replayed(stubs, op, call) is NotImplemented, (index, held)
    assert not stubs.launches
    assert replayed(stubs, op, siblings(args)) is not NotImplemented


def _placed(base, byte_offset, like):
    """A view of ``base`` (uint8) with ``like``'s dtype, shape and strides from ``byte_offset``."""
    return base.view(like.dtype).as_strided(like.shape, like.stride(), byte_offset // like.element_size())


def _python_refuses(op, args):
    try:
        python_check(op, args)
    except ValueError as exc:
        assert "shares memory" in str(exc)
        return True
    return False


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("op", OPS)
def test_overlaps_are_decided_as_python_decides(stubs, op, launcher):
    """Each output placed over, just before and just past each other tensor argument (in one buffer, same
    metadata as the registered call): C hands back exactly the calls the validator refuses."""
    args = random_args(op, 202)
    approve(stubs, op, launcher)
    python_path(stubs, op, launcher, args)
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    refused = taken = 0
    for output in host_path.REPLAYED[op]:
        if not isinstance(args[output], torch.Tensor):
            continue
        for other in tensors:
            if other == output:
                continue
            span = {i: _validate._span(args[i]) for i in (output, other)}
            sizes = {i: span[i][1] - span[i][0] for i in span}
            for gap in (-64, -sizes[output], -sizes[output] + 16, 0, 16, sizes[other], sizes[other] + 16):
                start = 1024 + 64 * 64 + (args[other].data_ptr() % 16)
                where = start + gap
                where += (args[output].data_ptr() - where) % 16  # the alignment of the registered call's
                where += (args[output].element_size() - where) % args[output].element_size()
                base = torch.zeros(-(-(start + sizes[other] + sizes[output] + 4096) // 8) * 8, dtype=torch.uint8)
                call = siblings(args)
                call[other] = _placed(base, start, args[other])
                call[output] = _placed(base, where, args[output])
                result = replayed(stubs, op, call)
                if _python_refuses(op, call):
                    assert result is NotImplemented, (output, other, gap)
                    refused += 1
                else:
                    assert result is call[host_path.REPLAYED[op][0]], (output, other, gap)
                    taken += 1
    assert refused and taken


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_no_plan_for_no_launch_or_a_tensor_passed_twice(stubs, launcher):
    op = "draft_decode"
    args = random_args(op, 303)
    args[5] = 0  # no steps: nothing is launched
    approve(stubs, op, launcher)
    assert python_path(stubs, op, launcher, args) is None
    assert stubs.module.replay_plan_count() == 0
    args = random_args("mha_page_table", 304)
    args[2] = args[1] = args[1].to(torch.int32)  # one tensor as two arguments: its slot has no one source
    approve(stubs, "mha_page_table", launcher)
    python_path(stubs, "mha_page_table", launcher, args)
    assert stubs.module.replay_plan_count() == 0


def test_plans_follow_approvals_launchers_and_clears(stubs):
    """A plan serves only the launcher the selector approved; clearing a launcher's plans (its plan caches',
    ``reset()``'s) drops its replay plans and keeps the other's."""
    op = "mha_page_table"
    args = random_args(op, 404)
    approve(stubs, op, "cupy")
    python_path(stubs, op, "cupy", args)
    assert replayed(stubs, op, args) is not NotImplemented
    approve(stubs, op, "triton")
    assert replayed(stubs, op, args) is NotImplemented  # Triton's plan does not exist yet
    python_path(stubs, op, "triton", args)
    assert replayed(stubs, op, args) is not NotImplemented
    assert stubs.module.replay_plan_count() == 2
    mapped_tables._mha_plans.clear()  # Triton's plan cache forgets: its C copies go with it
    assert replayed(stubs, op, args) is NotImplemented and stubs.module.replay_plan_count() == 1
    approve(stubs, op, "cupy")
    assert replayed(stubs, op, args) is not NotImplemented
    cupy_native.reset()
    assert replayed(stubs, op, args) is NotImplemented and stubs.module.replay_plan_count() == 0
    python_path(stubs, op, "cupy", args)
    stubs.context += 1  # another current context
    assert replayed(stubs, op, args) is NotImplemented
    stubs.context -= 1
    stubs.result = 1  # a failed launch
    assert replayed(stubs, op, args) is NotImplemented
    stubs.result = 0
    assert replayed(stubs, op, args) is not NotImplemented
    stubs.module.approve(host_path.OPS[op], 0, None, -1)
    assert replayed(stubs, op, args) is NotImplemented


def test_backend_requests_have_their_own_plans(stubs):
    op = "translated_page_table"
    args = random_args(op, 505)
    stubs.module.approve(host_path.OPS[op], 0, "cupy", host_path.LAUNCHERS["cupy"])
    stubs.module.approve(host_path.OPS[op], 0, None, host_path.LAUNCHERS["cupy"])
    stubs.recorder.launched.clear()
    host_path.call_and_register(op, "cupy", args, functools.partial(kernels_cupy.kernel(op), *args))
    assert stubs.module.replay(host_path.OPS[op], "cupy", *args) is args[4]
    for backend in (None, "auto", "CuPy", 3):
        assert stubs.module.replay(host_path.OPS[op], backend, *args) is NotImplemented, backend


def test_the_table_is_bounded(stubs, monkeypatch):
    """A full table (4096 plans: host_path.c's REPLAY_SLOTS, half full) registers nothing more (those calls stay on
    the Python path)."""
    op = "translated_page_table"
    approve(stubs, op, "cupy")
    args = random_args(op, 606)
    added = 0
    for delta in range(4200):
        args[8] = delta
        added += host_path.register_replay(op, None, args, host_path.Launch("cupy", CONTEXT, FUNCTION, (1, 1, 1),
                                                                            32, 0, (args[0], delta)))
    assert added == 4096 and stubs.module.replay_plan_count() == 4096
    args[8] = 0
    assert replayed(stubs, op, args) is args[4]
    args[8] = 4199
    assert replayed(stubs, op, args) is NotImplemented


def _public_call(op, args, **options):
    """The public function of ``op`` called with ``args`` (replay order) and ``options`` (backend, enable_pdl)."""
    if op == "page_table":
        return kvdispatch.create_flashmla_kv_indices(
            *args[:4], page_size=args[4], kv_start_idx=args[5], seqlen_offset=args[6], seq_lens_out=args[7],
            fill_value=args[8], round_toward_zero=args[9], **options)
    if op == "token_csr":
        return kvdispatch.create_flashinfer_kv_indices(*args[:5], kv_start_idx=args[5], entry_page_size=args[6],
                                                       token_mapping=args[7], v2p=args[8], page_size=args[9],
                                                       **options)
    return kvdispatch.create_dcp_page_table(*args[:4], page_size=args[4], dcp_size=args[5], dcp_rank=args[6],
                                            fill_value=args[7], round_toward_zero=args[8], v2p=args[9], **options)


@pytest.mark.parametrize("op", ("page_table", "token_csr", "dcp_page_table"))
def test_public_api_goes_through_it(stubs, monkeypatch, op):
    """Each public function passes its arguments to the replay entry in the API's order (which takes a call only
    once its plan exists); PDL and ``KVDISPATCH_DEBUG`` keep a call off it."""
    seen = []

    def entry(op, backend, *args):
        seen.append((op, backend, args))
        return NotImplemented

    monkeypatch.setattr(dispatch, "fast_replay", entry)
    args = random_args(op, 707)
    _public_call(op, args, backend="torch")
    assert seen[-1][0] == host_path.OPS[op] and seen[-1][1] == "torch"
    assert all(a is b for a, b in zip(seen[-1][2], args)) and len(seen[-1][2]) == len(args)
    count = len(seen)
    _public_call(op, args, backend="torch", enable_pdl=True)
    monkeypatch.setattr(_debug, "ENABLED", True)
    with contextlib.suppress(ValueError):  # the data checks name the random calls' bad entries
        _public_call(op, args, backend="torch")
    assert len(seen) == count


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_public_call_registers_and_its_next_call_is_replayed(stubs, monkeypatch, launcher):
    """Through the public API (CPU tensors as device 0's, the launcher selected): a page-table and a token-CSR
    call take the Python path and register their launch; the next call of the same key, with other tensors, is
    launched from C with exactly the Python path's parameters."""
    monkeypatch.setattr(dispatch, "fast_replay", stubs.module.replay)
    monkeypatch.setattr(kvdispatch.op, "_host_path", host_path)
    gpu = torch.device("cuda", 0)

    def call(device, op, backend, *args):  # the selector's choice of ``launcher`` and its Python path
        host_path.on_selected(launcher, gpu, op, backend)
        run = kernels_cupy.kernel(op) if launcher == "cupy" else functools.partial(kernels_triton.kernel(op), pdl=False)
        run(*args[:-1])

    monkeypatch.setattr(dispatch, "call", call)
    for name in ("create_flashmla_kv_indices", "create_flashinfer_kv_indices"):  # their checks, in their namespace
        monkeypatch.setitem(getattr(kvdispatch, name).__globals__, "check", lambda *a: gpu)
    for op, seed in (("page_table", 808), ("token_csr", 809)):
        args = random_args(op, seed)
        stubs.recorder.launched.clear()
        assert _public_call(op, args) is args[host_path.REPLAYED[op][0]]
        assert len(stubs.recorder.launched) == 1 and not stubs.launches
        second = siblings(args)
        params, *_ = python_path(stubs, op, launcher, second, register=False)
        stubs.count = len(params)
        assert _public_call(op, second) is second[host_path.REPLAYED[op][0]]
        assert [launch["params"] for launch in stubs.launches] == [params]
        stubs.launches.clear()


# Every option of the page table (kv_start_idx, seq_lens_out, fill_value, seqlen_offset, round_toward_zero, the
# page size) and of the token CSR (kv_start_idx, out's dtype, entry_page_size, token_mapping and its dtype).
PAGE_TABLE_OPTIONS = list(itertools.product((False, True), (False, True), (False, True), (0, 5), (False, True),
                                            (1, 64)))
TOKEN_CSR_OPTIONS = list(itertools.product((False, True), (torch.int32, torch.int64), (1, 16),
                                           (None, torch.int32, torch.int64)))


def _with_options(op, seed, options):
    args = random_args(op, seed)
    batch = args[1].shape[0]
    if op == "page_table":
        start, lens_out, fill, offset, round_toward_zero, page_size = options
        args[4:10] = [page_size, torch.zeros(batch, dtype=torch.int32) if start else None, offset,
                      torch.zeros(batch, dtype=torch.int32) if lens_out else None, -1 if fill else None,
                      round_toward_zero]
    else:
        start, out_dtype, entry_page_size, mapping = options
        args[4] = args[4].to(out_dtype)
        args[5:10] = [torch.zeros(batch, dtype=torch.int64) if start else None, entry_page_size,
                      None if mapping is None else torch.arange(50, dtype=mapping), None, 1]
    return args


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("op, options", [("page_table", o) for o in PAGE_TABLE_OPTIONS]
                         + [("token_csr", o) for o in TOKEN_CSR_OPTIONS])
def test_every_option_registers_a_replayable_plan(stubs, op, options, launcher):
    """Each option combination of the page table and the token CSR launches one kernel whose parameters are the
    call's tensors (Triton: the compiled signature's runtime arguments; CuPy: its KernelCall's pointers) and
    plain ints, so it registers a plan, and C replays it as the Python path launches."""
    args = _with_options(op, 900 + len(str(options)), options)
    approve(stubs, op, launcher)
    assert python_path(stubs, op, launcher, args) is not None
    assert stubs.module.replay_plan_count() == 1
    launch, params = assert_replays_as_python(stubs, op, launcher, siblings(args))
    assert launch["params"] == params


def test_the_plan_layout_is_the_c_parsers(stubs):
    """``host_path.ReplayPlan`` names ``add_replay``'s arguments in the order host_path.c parses them."""
    assert host_path.ReplayPlan._fields == stubs.module.REPLAY_PLAN_FIELDS


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("start, out_dtype, page_size, v2p_dtype",
                         list(itertools.product((False, True), (torch.int32, torch.int64), (1, 16),
                                                (torch.int32, torch.int64))))
def test_the_packed_read_stream_registers_a_replayable_plan(stubs, start, out_dtype, page_size, v2p_dtype, launcher):
    """The token CSR through ``v2p`` (the unified pool's packed read stream), as the options above."""
    args = random_args("token_csr", 950 + page_size)
    batch = args[1].shape[0]
    args[4] = args[4].to(out_dtype)
    args[5:10] = [torch.zeros(batch, dtype=torch.int64) if start else None, 1, None,
                  torch.arange(-1, 60, dtype=v2p_dtype), page_size]
    approve(stubs, "token_csr", launcher)
    assert python_path(stubs, "token_csr", launcher, args) is not None
    assert stubs.module.replay_plan_count() == 1
    launch, params = assert_replays_as_python(stubs, "token_csr", launcher, siblings(args))
    assert launch["params"] == params


# The compacted CSR and the prefix+extend CSR.
_random_args_before_csr_ops = random_args
_hostile_args_before_csr_ops = hostile_args


def random_args(op, seed):  # noqa: F811
    if op == "compact_csr":
        d = Draw(seed)
        rows, cols, batch, table, _, lens = d.common()
        total = d.int(1, 900)
        return [table, lens, d.vector(-5, total, batch + 1), torch.zeros(total, dtype=d.pick((torch.int32,
                torch.int64))), d.pick((0, 1, 3)), d.pick((None, d.vector(-2, cols, batch))), d.int(0, 4),
                d.pick((1, 2, 5)), d.pick((None, 0, -7)), d.pick((None, 0, 9, 2**62))]
    if op == "prefix_extend_csr":
        d = Draw(seed)
        batch, total = d.int(1, 9), d.int(1, 900)
        return [d.vector(-3, 300, batch), d.vector(-5, 2**20, batch), d.vector(-3, 300, batch),
                d.vector(-5, 2**20, batch), d.vector(-5, total, batch + 1),
                torch.zeros(total, dtype=d.pick((torch.int32, torch.int64))), d.pick((0, 5, 2**40, -(2**63)))]
    args = _random_args_before_csr_ops(op, seed)
    if op == "dcp_page_table":  # its v2p (the unified pool), or none
        d = Draw(seed + 1)
        args.append(d.pick((None, d.vector(-1, 1000, d.int(1, 40), strided=False))))
    return args


def hostile_args(op, seed, kind):  # noqa: F811
    if op == "prefix_extend_csr":  # no table: its hostile calls are stride-0 vectors and an out of 2**31 entries
        args = random_args(op, seed)
        if kind == "pool stride 0":
            args[1] = args[1][:1].expand(args[0].shape[0])
        elif kind == "out past 2**31":
            args[5] = args[5][:1].expand(2**31)
        return args
    args = _hostile_args_before_csr_ops(op, seed, kind)
    if op == "compact_csr" and kind == "out past 2**31":
        args[3] = args[3][:1].expand(2**31)
    return args
