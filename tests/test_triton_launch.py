"""The Triton launch machinery: call-convention detection (CPU, on fake compiled kernels), the plain and
fast paths against the reference (GPU), device and stream handling, edge cases of the launchers."""

import contextlib
import inspect

import pytest
import torch

from conftest import DEVICE, HAS_GPU, require_host_path

pytest.importorskip("triton")

import kernels_triton  # noqa: E402
from kvdispatch import ops
import kvdispatch  # noqa: E402
from kernels_triton import launch, page_table, token_csr  # noqa: E402
from kvcases import POISON, make_case  # noqa: E402
from kvdispatch import host_path  # noqa: E402

ARG_NAMES = ("a_ptr", "n", "BLOCK")
CONSTEXPR_NAMES = ("BLOCK",)
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")


class FakeSource:
    def __init__(self, signature):
        self.signature = signature


class FakeCompiled:
    """Stands for a ``triton.compiler.CompiledKernel``: ``run`` records what it is given."""

    def __init__(self, run, signature=None):
        self.run = run
        self.function = 1234
        self.packed_metadata = ("metadata",)
        self.src = FakeSource({"a_ptr": "*i32", "n": "i32", "BLOCK": "constexpr"} if signature is None else signature)


class Launcher36:
    """The 3.0-3.7 launcher: metadata, hooks and kernel arguments all travel in ``*args``."""

    def __init__(self):
        self.calls = []

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.calls.append((gridX, gridY, gridZ, stream, function) + args)


class Launcher38:
    def __init__(self):
        self.calls = []

    def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata, launch_enter_hook,
                 launch_exit_hook, *args):
        self.calls.append((gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                           launch_enter_hook, launch_exit_hook) + args)


class ForwardingLauncher36:
    """Triton 3.6's NVIDIA CudaLauncher in miniature: ``__call__`` only forwards to ``launch`` (the C
    function), with no scratch buffer when their sizes are 0. Its source is what ``direct_launch`` checks."""

    global_scratch_size = global_scratch_align = profile_scratch_size = profile_scratch_align = 0
    launch_cooperative_grid, launch_pdl = False, "pdl-flag"

    def __init__(self):
        self.calls, self.launch_calls = [], []
        self.launch = lambda *args: self.launch_calls.append(args)

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):

        def allocate_scratch(size, align, allocator):
            if size > 0:
                raise AssertionError("no scratch in these tests")
            return None

        global_scratch = allocate_scratch(self.global_scratch_size, self.global_scratch_align, None)
        profile_scratch = allocate_scratch(self.profile_scratch_size, self.profile_scratch_align,
                                           None)
        self.calls.append((gridX, gridY, gridZ, stream, function) + args)
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,
                    global_scratch, profile_scratch, *args)


def launcher_2x(grid0, grid1, grid2, num_warps, num_ctas, cluster_x, cluster_y, cluster_z, shared, stream, function,
                enter_hook, exit_hook, compiled, *args):
    pass


@pytest.mark.parametrize("make_run", (Launcher36, Launcher38))
def test_detects_known_conventions(make_run):
    convention = launch.detect_convention(FakeCompiled(make_run()), ARG_NAMES, CONSTEXPR_NAMES)
    assert convention == launch.FastConvention(with_constexprs=True)
    # Triton < 3.3 left constexprs out of the signature, and out of the launch arguments.
    old = FakeCompiled(make_run(), signature={0: "*i32", 1: "i32"})
    assert launch.detect_convention(old, ARG_NAMES, CONSTEXPR_NAMES) == launch.FastConvention(with_constexprs=False)


def test_unknown_conventions_fall_back_to_plain():
    assert launch.detect_convention(FakeCompiled(launcher_2x), ARG_NAMES, CONSTEXPR_NAMES) is None
    assert launch.detect_convention(FakeCompiled(len), ARG_NAMES, CONSTEXPR_NAMES) is None  # no signature
    assert launch.detect_convention(FakeCompiled(lambda gridX, gridY, gridZ, stream, function: None),
                                    ARG_NAMES, CONSTEXPR_NAMES) is None  # takes no kernel arguments
    no_metadata = FakeCompiled(Launcher38())
    del no_metadata.packed_metadata
    assert launch.detect_convention(no_metadata, ARG_NAMES, CONSTEXPR_NAMES) is None
    odd_signature = FakeCompiled(Launcher38(), signature={"a_ptr": "*i32"})
    assert launch.detect_convention(odd_signature, ARG_NAMES, CONSTEXPR_NAMES) is None


def _installed_launcher_classes():
    classes = []
    for module_name, class_name in (("triton.backends.nvidia.driver", "CudaLauncher"),
                                    ("triton.backends.amd.driver", "HIPLauncher")):
        try:
            module = __import__(module_name, fromlist=[class_name])
        except Exception:  # noqa: BLE001  (a backend that cannot import here)
            continue
        if hasattr(module, class_name):
            classes.append(getattr(module, class_name))
    return classes


@pytest.mark.parametrize("launcher_class", _installed_launcher_classes(), ids=lambda c: c.__name__)
def test_installed_triton_launchers_are_recognised(launcher_class):
    """The launcher classes of the installed Triton have a call form the fast path knows."""
    run = object.__new__(launcher_class)  # the call signature only; nothing is loaded
    assert launch.detect_convention(FakeCompiled(run), ARG_NAMES, CONSTEXPR_NAMES) is not None, \
        inspect.signature(run)


def test_direct_launch_detection():
    run = ForwardingLauncher36()
    direct = launch.direct_launch(FakeCompiled(run))
    assert direct == launch.DirectLaunch(run.launch, False, "pdl-flag")
    run.global_scratch_size = 16  # a kernel with scratch memory: run allocates it, so no direct call
    assert launch.direct_launch(FakeCompiled(run)) is None
    for other in (Launcher36(), Launcher38(), launcher_2x):
        assert launch.direct_launch(FakeCompiled(other)) is None
    assert not launch.forwards_to_c_launch(Launcher36) and not launch.forwards_to_c_launch(len)


@pytest.mark.parametrize("launcher_class", _installed_launcher_classes(), ids=lambda c: c.__name__)
def test_installed_triton_direct_launch_is_known(launcher_class):
    """Triton 3.6's NVIDIA launcher forwards directly; the AMD ones and 3.8's do more (run stays). Other
    releases have not been read: only that detection does not fail on them."""
    import triton

    version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    forwards = launch.forwards_to_c_launch(launcher_class)
    if launcher_class.__name__ != "CudaLauncher" or version >= (3, 8):
        assert not forwards, triton.__version__
    elif version == (3, 6):
        assert forwards, triton.__version__


@pytest.fixture
def fake_device(monkeypatch):
    """Device 3 is current; its raw stream is 77. No CUDA is touched."""
    current = {"device": 3}
    monkeypatch.setattr(launch, "_raw_stream", lambda index: 70 + index + 4)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: current["device"], raising=False)

    @contextlib.contextmanager
    def device(index):
        saved, current["device"] = current["device"], index
        yield
        current["device"] = saved

    monkeypatch.setattr(torch.cuda, "device", device)
    return current


@pytest.mark.parametrize("make_run", (Launcher36, Launcher38))
@pytest.mark.parametrize("with_constexprs", (True, False))
def test_fast_launcher_call(fake_device, make_run, with_constexprs):
    run = make_run()
    fast = launch.fast_launcher(FakeCompiled(run), launch.FastConvention(with_constexprs), (5, 6, 7), (128,), 3)
    tensor = torch.arange(3, dtype=torch.int32)
    fast(tensor, 42)
    # Pointer parameters travel as addresses, so Triton's launcher skips its per-pointer driver query.
    tail = (tensor.data_ptr(), 42, 128) if with_constexprs else (tensor.data_ptr(), 42)
    assert run.calls == [(5, 6, 7, 77, 1234, ("metadata",), None, None, None) + tail]


def test_direct_launcher_call(fake_device):
    run = ForwardingLauncher36()
    direct = launch.direct_launch(FakeCompiled(run))
    fast = launch.fast_launcher(FakeCompiled(run), launch.FastConvention(True), (5, 6, 7), (128,), 3, direct)
    tensor = torch.arange(3, dtype=torch.int32)
    fast(tensor, 42)
    # Exactly what run.__call__ would have passed its C function, without the Python frame.
    via_run = ForwardingLauncher36()
    via_run(5, 6, 7, 77, 1234, ("metadata",), None, None, None, tensor.data_ptr(), 42, 128)
    assert run.launch_calls == via_run.launch_calls and not run.calls


def test_fast_launcher_makes_the_device_current(fake_device):
    seen = []

    class Run(Launcher38):
        def __call__(self, *args):
            seen.append((fake_device["device"], args[3]))

    fast = launch.fast_launcher(FakeCompiled(Run()), launch.FastConvention(True), (1, 1, 1), (128,), 1)
    fast(torch.zeros(1), 1)
    assert seen == [(1, 75)] and fake_device["device"] == 3


class FakeKernel:
    """Stands for a JITFunction: ``kernel[grid](...)`` returns one compiled kernel and counts calls."""

    arg_names = list(ARG_NAMES)

    def __init__(self, run):
        self.compiled = FakeCompiled(run)
        self.plain_calls = []

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.plain_calls.append((grid, args, kwargs))
            return self.compiled
        return call


@pytest.mark.parametrize("mode", ("auto", "fast", "plain"))
def test_plan_compiles_once_then_uses_the_chosen_path(fake_device, monkeypatch, mode):
    monkeypatch.setenv(launch.LAUNCH_ENV, mode)
    run = Launcher38()  # no direct path: auto means fast
    kernel = FakeKernel(run)
    launcher = launch.KernelLauncher(kernel, CONSTEXPR_NAMES)
    plan, launched = launcher.plan(3, ("spec",), (2, 4, 1), {"BLOCK": 128}, 4, ("t", 9))
    assert launched and len(kernel.plain_calls) == 1 and not run.calls
    t = torch.zeros(2)
    plan(t, 10)
    again, launched = launcher.plan(3, ("spec",), (2, 8, 3), {"BLOCK": 128}, 4, (t, 11))
    assert not launched
    again(t, 11)
    if mode == "plain":
        assert len(kernel.plain_calls) == 3 and not run.calls
        assert kernel.plain_calls[2] == ((2, 8, 3), (t, 11), {"BLOCK": 128, "num_warps": 4})
    else:
        assert len(kernel.plain_calls) == 1
        address = t.data_ptr()
        assert [c[:3] + c[-3:] for c in run.calls] == [(2, 4, 1, address, 10, 128), (2, 8, 3, address, 11, 128)]
    assert launcher.compile_count == 1


@pytest.mark.parametrize("mode", ("auto", "direct", "fast"))
def test_plan_takes_the_direct_path_where_it_is_detected(fake_device, monkeypatch, mode):
    monkeypatch.setenv(launch.LAUNCH_ENV, mode)
    run = ForwardingLauncher36()
    launcher = launch.KernelLauncher(FakeKernel(run), CONSTEXPR_NAMES)
    launcher.plan(3, ("spec",), (2, 4, 1), {"BLOCK": 128}, 4, ("t", 9))
    plan, launched = launcher.plan(3, ("spec",), (2, 4, 1), {"BLOCK": 128}, 4, ("t", 9))
    t = torch.zeros(2)
    plan(t, 10)
    address = t.data_ptr()
    assert [c[-3:] for c in run.launch_calls] == [(address, 10, 128)]
    assert len(run.calls) == (1 if mode == "fast" else 0)  # direct: run.__call__ never ran


@pytest.mark.parametrize("supported", (False, True))
def test_plan_asks_for_launch_pdl_only_where_the_device_supports_it(fake_device, monkeypatch, supported):
    """A true PDL constexpr compiles the kernel with Triton's ``launch_pdl`` option where the device supports
    programmatic dependent launch; elsewhere PDL is compiled out and the option not passed."""
    monkeypatch.setenv(launch.LAUNCH_ENV, "plain")
    monkeypatch.setattr(launch, "supports_pdl", lambda index: supported)
    kernel = FakeKernel(Launcher38())
    plan, _ = launch.KernelLauncher(kernel, CONSTEXPR_NAMES).plan(3, ("spec", True), (2, 4, 1),
                                                                  {"BLOCK": 128, "PDL": True}, 4, ("t", 9))
    plan("t", 10)
    expected = dict(BLOCK=128, PDL=True, num_warps=4, launch_pdl=True) if supported else dict(BLOCK=128, PDL=False,
                                                                                              num_warps=4)
    assert [call[2] for call in kernel.plain_calls] == [expected, expected]


def test_pdl_flag_follows_the_compiled_kernel_on_the_direct_path(fake_device, monkeypatch):
    """The direct path passes the launcher's own ``launch_pdl`` (set from the compiled kernel's metadata)."""
    monkeypatch.setenv(launch.LAUNCH_ENV, "direct")
    run = ForwardingLauncher36()
    run.launch_pdl = True
    launcher = launch.KernelLauncher(FakeKernel(run), CONSTEXPR_NAMES)
    launcher.plan(3, ("spec",), (2, 4, 1), {"BLOCK": 128}, 4, ("t", 9))
    plan, _ = launcher.plan(3, ("spec",), (2, 4, 1), {"BLOCK": 128}, 4, ("t", 9))
    plan(torch.zeros(2), 10)
    assert run.launch_calls[-1][5:7] == (run.launch_cooperative_grid, True)


def test_direct_mode_raises_without_a_direct_path(fake_device, monkeypatch):
    monkeypatch.setenv(launch.LAUNCH_ENV, "direct")
    launcher = launch.KernelLauncher(FakeKernel(Launcher38()), CONSTEXPR_NAMES)
    with pytest.raises(RuntimeError, match="direct"):
        launcher.plan(0, ("spec",), (1, 1, 1), {"BLOCK": 128}, 4, ("t", 1))


def test_unknown_convention_auto_is_plain_fast_raises(fake_device, monkeypatch):
    launcher = launch.KernelLauncher(FakeKernel(launcher_2x), CONSTEXPR_NAMES)
    monkeypatch.setenv(launch.LAUNCH_ENV, "auto")
    plan, _ = launcher.plan(0, ("spec",), (1, 1, 1), {"BLOCK": 128}, 4, ("t", 1))
    plan("t", 2)
    assert len(launcher.kernel.plain_calls) == 2
    monkeypatch.setenv(launch.LAUNCH_ENV, "fast")
    with pytest.raises(RuntimeError, match="fast"):
        launcher.plan(0, ("spec",), (1, 1, 1), {"BLOCK": 128}, 4, ("t", 1))


def test_launch_mode_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv(launch.LAUNCH_ENV, "quick")
    with pytest.raises(ValueError, match="plain"):
        launch.launch_mode()


def test_import_initialises_no_gpu():
    import subprocess
    import sys

    code = "import kernels_triton, torch; assert not torch.cuda.is_initialized(); print('ok')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "ok"


# --- launcher edge cases (interpreter on CPU, compiled on a GPU) -------------------------------------

def test_seq_lens_out_written_for_zero_width_table():
    case = make_case(3, 16, device=DEVICE, seqlen_offset=2)
    out = torch.empty((3, 0), dtype=torch.int32, device=DEVICE)
    seq_out = torch.full((4,), POISON, dtype=torch.int32, device=DEVICE)
    expected = seq_out.clone()
    ops.page_table.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, out, 16, None, 2,
                               expected, None)
    kernels_triton.build_page_table(case.req_to_token, case.req_pool_indices, case.seq_lens, out, 16, None, 2,
                                    seq_out, None)
    assert torch.equal(seq_out.cpu(), expected.cpu())


def _api_matches_reference(table, pool, lens, page_size, width, **options):
    out = torch.full((pool.shape[0] + 1, width), POISON, dtype=torch.int32, device=table.device)
    expected = out.clone()
    ops.page_table.reference(table, pool, lens, expected, page_size, options.get("kv_start_idx"),
                               options.get("seqlen_offset", 0), None, options.get("fill_value"))
    for _ in range(2):  # the second call takes the launch plan (in C where available)
        out.fill_(POISON)
        kvdispatch.create_flashmla_kv_indices(table, pool, lens, out, page_size=page_size, backend="triton",
                                              **options)
        assert torch.equal(out.cpu(), expected.cpu())


@pytest.mark.parametrize("page_size", (1, 64))
@pytest.mark.parametrize("with_start", (False, True))
def test_tables_of_2_31_rows_take_the_64_bit_path(page_size, with_start):
    """A table of 2**31 + 5 rows (one row expanded: stride 0, no memory) puts the kernel on its 64-bit path:
    int64 pool indices past 2**31 are read, the ones past the table are not."""
    cols = 3 * page_size + 5
    table = (torch.arange(cols, dtype=torch.int32, device=DEVICE) * 7 - 20).expand(2**31 + 5, cols)
    pool = torch.tensor([2**31 + 4, 2**31 + 5, 3, -1, 2**32 + 1, 2**31 - 1], dtype=torch.int64, device=DEVICE)
    lens = torch.tensor([cols, cols, 2 * page_size, cols, cols, page_size + 1], device=DEVICE)
    start = torch.tensor([0, 0, 1, 0, 0, 3], device=DEVICE) if with_start else None
    _api_matches_reference(table, pool, lens, page_size, 5, kv_start_idx=start, seqlen_offset=1, fill_value=-1)


@pytest.mark.parametrize("page_size", (1, 64))
def test_tables_of_one_expanded_row_take_the_packed_path(page_size):
    """Rows that are one expanded row (stride 0) pack into words below 2**31, which the interpreter passes as
    int32 scalars whatever the annotation: the kernel widens them before taking their fields apart."""
    cols = 3 * page_size + 5
    table = (torch.arange(cols, dtype=torch.int32, device=DEVICE) * 7 - 20).expand(6, cols)
    pool = torch.tensor([5, 0, 6, -1], device=DEVICE)
    lens = torch.tensor([cols, 2 * page_size, cols, cols], device=DEVICE)
    _api_matches_reference(table, pool, lens, page_size, 5, fill_value=-1)


def test_packed_words_hold_32_bit_fields_or_nothing():
    """The common path's two parameter words: rows | row stride << 32, and page limit | rows aligned << 31 |
    out row stride << 32; None (the 64-bit path) as soon as one value reaches 2**31."""
    top = page_table.WIDE - 1
    packed_table, packed_out = page_table.packed_words(top, top - 1, 1000, 7, top, 16, True)
    assert (packed_table & 0xFFFFFFFF, packed_table >> 32) == (top, top - 1)
    assert (packed_out & 0x7FFFFFFF, packed_out >> 31 & 1, packed_out >> 32) == (7, 1, top)
    # The page limit: the output's width, or the pages that start inside a table row (ceil(C / page)).
    assert page_table.packed_words(5, 40, 1000, 100, 64, 16, False)[1] == 63 | 64 << 32
    assert page_table.packed_words(5, 40, 1008, 100, 64, 16, False)[1] == 63 | 64 << 32
    assert page_table.packed_words(5, 40, 1009, 100, 64, 16, False)[1] == 64 | 64 << 32
    assert page_table.packed_words(5, 40, 0, 100, 64, 16, False)[1] == 0 | 64 << 32
    for wide in ((top + 1, 1, 10, 10, 10), (1, top + 1, 10, 10, 10), (1, 1, 10, top + 1, 10),
                 (1, 1, 10, 10, top + 1)):
        assert page_table.packed_words(*wide, 1, False) is None, wide


def test_csr_packed_words_hold_32_bit_fields_or_nothing():
    """The CSR kernels' two parameter words: rows | row stride << 32 and cols | out length << 32; None (the
    full-width parameters) as soon as one value reaches 2**31."""
    top = launch.WIDE - 1
    packed_table, packed_sizes = launch.csr_packed_words(top, top - 1, 5, top - 2)
    assert (packed_table & 0xFFFFFFFF, packed_table >> 32) == (top, top - 1)
    assert (packed_sizes & 0xFFFFFFFF, packed_sizes >> 32) == (5, top - 2)
    assert launch.csr_packed_words(0, 0, 0, 0) == (0, 0)
    for wide in ((top + 1, 1, 1, 1), (1, top + 1, 1, 1), (1, 1, top + 1, 1), (1, 1, 1, top + 1)):
        assert launch.csr_packed_words(*wide) is None, wide


@pytest.mark.parametrize("with_start", (False, True))
@pytest.mark.parametrize("edge", ("rows 2**31 - 1", "rows 2**31 + 5", "row stride 2**31 - 1", "row stride 2**31"))
def test_csr_tables_at_the_2_31_edge(edge, with_start):
    """Tables at the edge of the packed words (no memory behind them: one row expanded to 2**31 +- a few
    rows, or one row with a huge row stride): below it the call takes the packed words, at it the
    full-width parameters; int64 pool indices past 2**31 are read, the ones past the table are not."""
    cols = 300
    row = torch.arange(cols, dtype=torch.int32, device=DEVICE) * 7 - 20
    size = 2**31 - 1 if edge.endswith("- 1") else 2**31 + (5 if edge.startswith("rows") else 0)
    if edge.startswith("rows"):
        table = row.expand(size, cols)
        pool = torch.tensor([size - 1, size, 3, -1, 2**32 + 1, 2**31 - 2], dtype=torch.int64, device=DEVICE)
    else:
        table = row.as_strided((1, cols), (size, 1))
        pool = torch.tensor([0, 1, 0, -1, 2**32, 0], dtype=torch.int64, device=DEVICE)
    lens = torch.tensor([cols, 40, 17, cols, cols, 290], device=DEVICE)
    start = torch.tensor([0, 5, 1, 0, 0, 12], device=DEVICE) if with_start else None
    indptr = torch.tensor([0, 300, 340, 357, 657, 957], device=DEVICE)
    out = torch.full((1200,), POISON, dtype=torch.int32, device=DEVICE)
    key, _ = token_csr.plan_key_and_arguments(table, pool, lens, indptr, out, start)
    assert key[8] == (size >= token_csr.WIDE)  # wide indexing
    expected = out.clone()
    ops.token_csr.reference(table, pool, lens, indptr, expected, start)
    for _ in range(2):  # the second call takes the launch plan (in C where available)
        out.fill_(POISON)
        kvdispatch.create_flashinfer_kv_indices(table, pool, lens, indptr, out, kv_start_idx=start, backend="triton")
        assert torch.equal(out.cpu(), expected.cpu())


@pytest.mark.parametrize("page_size", (1, 64))
@pytest.mark.parametrize("out_stride", (2**31 - 1, 2**31))
def test_output_row_strides_at_2_31(page_size, out_stride):
    """An output row stride of 2**31 - 1 (one row: no memory behind the stride) still fits the packed words;
    one of 2**31 does not, and the call takes the 64-bit path. Both write that row only, correctly."""
    case = make_case(1, page_size, max_pages=6, device=DEVICE)
    width = 9
    store = torch.full((width,), POISON, dtype=torch.int32, device=DEVICE)
    out = store.as_strided((1, width), (out_stride, 1))
    key, _ = page_table.plan_key_and_arguments(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                               page_size)
    assert key[10] == (out_stride >= page_table.WIDE)  # wide indexing
    expected = out.clone()
    ops.page_table.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, expected, page_size,
                               None, 1, None, -1)
    for _ in range(2):  # the second call takes the launch plan (in C where available)
        store.fill_(POISON)
        kvdispatch.create_flashmla_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, out,
                                              page_size=page_size, seqlen_offset=1, fill_value=-1, backend="triton")
        assert torch.equal(out.cpu(), expected.cpu())


@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("page_size", (1, 16, 64))
def test_range_checks_of_the_32_bit_path(index_dtype, page_size):
    """Pool indices and lengths at the edges of the compares the 32-bit path makes: indices past 2**32 (whose
    low 32 bits are a valid row), negative ones, lengths near 2**31 with a seqlen_offset."""
    case = make_case(4, page_size, max_pages=5, device=DEVICE)
    table = case.req_to_token
    rows = table.shape[0]
    big = [2**32 + 1, -(2**32) + 1] if index_dtype == torch.int64 else [-2**31, 2**31 - 1]
    pool = torch.tensor([1, rows - 1, rows, -1] + big, dtype=index_dtype, device=DEVICE)
    top = 2**31 - 1 if index_dtype == torch.int32 else 2**40
    lens = torch.tensor([top, -5, 3, 1, 2, top], dtype=index_dtype, device=DEVICE)
    for offset in (0, -(2**31) + 1, 2**31 - 1, -3):
        _api_matches_reference(table, pool, lens, page_size, 7, seqlen_offset=offset)


@pytest.mark.parametrize("page_size", (1, 3, 16, 96))
@pytest.mark.parametrize("fill_value", (None, 5))
def test_negative_slots_floor_divide(page_size, fill_value):
    case = make_case(4, page_size, max_pages=20, device=DEVICE, fill_value=fill_value, with_start=True)
    case.req_to_token.neg_()
    case.req_to_token[0, 0] = -1
    out = case.page_table_out()
    expected = out.clone()
    args = (case.req_pool_indices, case.seq_lens)
    ops.page_table.reference(case.req_to_token, *args, expected, page_size, case.kv_start_idx, 0, None, fill_value)
    kernels_triton.build_page_table(case.req_to_token, *args, out, page_size, case.kv_start_idx, 0, None,
                                    fill_value)
    assert torch.equal(out.cpu(), expected.cpu())


def _page_table_matches(case, out_offset=0):
    store = torch.full((case.batch + 1, case.width + 8), POISON, dtype=torch.int32, device=DEVICE)
    out = store[:, out_offset:out_offset + case.width]
    seq_out = torch.full((case.batch,), POISON, dtype=torch.int32, device=DEVICE)
    expected, expected_seq = out.clone(), seq_out.clone()
    args = (case.req_to_token, case.req_pool_indices, case.seq_lens)
    ops.page_table.reference(*args, expected, case.page_size, case.kv_start_idx, 1, expected_seq, case.fill_value)
    kvdispatch.create_flashmla_kv_indices(*args, out, page_size=case.page_size, kv_start_idx=case.kv_start_idx,
                                          seqlen_offset=1, seq_lens_out=seq_out, fill_value=case.fill_value,
                                          backend="triton")
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(seq_out, expected_seq, rtol=0, atol=0)


@pytest.mark.parametrize("page_size", (1, 64))
@pytest.mark.parametrize("out_offset", (0, 1, 4))
def test_unaligned_and_aligned_rows(page_size, out_offset):
    """Outputs whose rows start off a 16-byte boundary take the masked path, aligned ones the wide one."""
    case = make_case(3, page_size, max_pages=page_table.constexprs_for(page_size, 0, 0, 0)["PAGES_PER_PROGRAM"] * 2,
                     device=DEVICE)
    case.seq_lens.fill_(case.req_to_token.shape[1])  # whole blocks: the unmasked path runs
    _page_table_matches(case, out_offset)


# --- GPU: both launch paths against the reference --------------------------------------------------

def _direct_path_here() -> bool:
    from triton.backends.nvidia.driver import CudaLauncher

    return torch.version.cuda is not None and launch.forwards_to_c_launch(CudaLauncher)


def _native_launches() -> int:
    return host_path._module.launch_count() if host_path._module is not None else 0


@pytest.fixture(params=("plain", "fast", "direct", "native"))
def launch_path(request, monkeypatch):
    if request.param == "direct" and HAS_GPU and not _direct_path_here():
        pytest.skip("the installed Triton's launcher has no direct path (Triton 3.6 on NVIDIA has one)")
    if request.param == "native" and HAS_GPU:
        require_host_path()
    monkeypatch.setenv(launch.LAUNCH_ENV, request.param)
    launch.reset()
    yield request.param
    launch.reset()


@needs_gpu
@pytest.mark.parametrize("page_size", (1, 3, 16, 64, 96, 4096))
@pytest.mark.parametrize("with_start", (False, True))
def test_gpu_page_table_paths(launch_path, page_size, with_start):
    for attempt in range(3):  # repeated calls: the second and third take the cached plan
        case = make_case(9, page_size, max_pages=page_table.constexprs_for(page_size, 0, 0, 0)["PAGES_PER_PROGRAM"]
                         + 3, device=DEVICE, with_start=with_start, strided_table=attempt == 1,
                         fill_value=-1 if attempt == 2 else None, width=None)
        _page_table_matches(case)
    before, native_before = page_table.launcher.plain_launches, _native_launches()
    _page_table_matches(case)  # the same call again: its plan exists
    if launch_path != "plain":
        assert page_table.launcher.plain_launches == before
    if launch_path == "native":
        assert _native_launches() == native_before + 1
    elif launch_path != "plain":  # auto would take it in C, a mode below native never does
        assert _native_launches() == native_before


@needs_gpu
def test_gpu_compiled_path_serves_again_after_a_reset(monkeypatch):
    """kvdispatch.reset() forgets the selection, not the plans: the first call after it selects Triton again
    (in Python), and the next one goes through C without a new plan."""
    require_host_path()
    monkeypatch.setenv(launch.LAUNCH_ENV, "native")
    launch.reset()
    case = make_case(5, 64, max_pages=20, device=DEVICE)
    _page_table_matches(case)
    kvdispatch.reset()
    before, plans = _native_launches(), len(page_table._plans)
    _page_table_matches(case)
    _page_table_matches(case)
    assert _native_launches() == before + 1 and len(page_table._plans) == plans
    launch.reset()


@needs_gpu
@pytest.mark.parametrize("with_start", (False, True))
def test_gpu_token_csr_paths(launch_path, with_start):
    for _ in range(3):
        case = make_case(7, 64, max_pages=70, device=DEVICE, with_start=with_start)
        launch.reset()  # random cases can share a plan key (batch and table width): each case's first call plans
        indptr, out = case.csr()
        expected = out.clone()
        ops.token_csr.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, expected,
                                      case.kv_start_idx)
        for call in range(2):  # the second call takes the plan (in C in native mode)
            before = _native_launches()
            out.fill_(POISON)
            kvdispatch.create_flashinfer_kv_indices(case.req_to_token, case.req_pool_indices, case.seq_lens,
                                                    indptr, out, kv_start_idx=case.kv_start_idx, backend="triton")
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
            assert _native_launches() == before + (call if launch_path == "native" else 0)


@needs_gpu
def test_gpu_side_stream_and_graph_replay(launch_path):
    case = make_case(4, 16, max_pages=40, device=DEVICE)
    out = case.page_table_out()
    args = (case.req_to_token, case.req_pool_indices, case.seq_lens, out)

    def build():
        kvdispatch.create_flashmla_kv_indices(*args, page_size=16, backend="triton")

    build()  # compile and plan outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    native_before = _native_launches()
    with torch.cuda.stream(side):
        out.fill_(POISON)
        build()
    torch.cuda.current_stream().wait_stream(side)
    expected = out.clone().fill_(POISON)
    ops.page_table.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, expected, 16)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        build()
    assert _native_launches() == native_before + (2 if launch_path == "native" else 0)
    case.seq_lens.copy_(torch.randint(1, 40 * 16, case.seq_lens.shape, device=DEVICE))
    out.fill_(POISON)
    graph.replay()
    torch.cuda.synchronize()
    expected.fill_(POISON)
    ops.page_table.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, expected, 16)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@needs_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gpu_tensors_on_another_device_than_the_current_one(launch_path):
    torch.cuda.set_device(0)
    for device in (torch.device("cuda", 1), torch.device("cuda", 0), torch.device("cuda", 1)):
        case = make_case(5, 64, max_pages=40, device=device)
        out = case.page_table_out()
        expected = out.clone()
        args = (case.req_to_token, case.req_pool_indices, case.seq_lens)
        ops.page_table.reference(*args, expected, 64)
        for _ in range(2):  # the second call takes the plan (in C, where the device is current)
            out.fill_(POISON)
            kvdispatch.create_flashmla_kv_indices(*args, out, page_size=64, backend="triton")
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
            assert torch.cuda.current_device() == 0


@needs_gpu
def test_gpu_int64_addresses():
    """Pool rows past 2**31 elements: address arithmetic must be 64-bit."""
    if torch.cuda.get_device_properties(DEVICE).total_memory < 24 * 2**30:
        pytest.skip("needs 24 GiB of device memory")
    cols = 2**30 + 16
    table = torch.empty((3, cols), dtype=torch.int32, device=DEVICE)  # 12 GiB
    table[2, :4096] = torch.arange(4096, device=DEVICE, dtype=torch.int32) + 7 * 64
    pool = torch.tensor([2], device=DEVICE)
    lens = torch.tensor([4096], device=DEVICE)
    out = torch.full((1, 64), POISON, dtype=torch.int32, device=DEVICE)
    kernels_triton.build_page_table(table, pool, lens, out, 64)
    assert torch.equal(out[0], torch.arange(64, device=DEVICE, dtype=torch.int32) + 7)
    csr = torch.full((4096,), POISON, dtype=torch.int32, device=DEVICE)
    kernels_triton.build_token_indices(table, pool, lens, torch.tensor([0, 4096], device=DEVICE), csr)
    assert torch.equal(csr, table[2, :4096])
    del table


@pytest.mark.parametrize("begin", (-3000, -5, 0, 2400))
def test_csr_row_starting_before_out_spans_programs(begin):
    """A long row whose kv_indptr is negative: its in-range tokens start at j = -begin, past program 0."""
    case = make_case(2, 64, max_pages=90, device=DEVICE)
    case.seq_lens.fill_(5000)
    indptr = torch.tensor([begin, begin + 5000, begin + 10000], device=DEVICE)
    out = torch.full((2500,), POISON, dtype=torch.int32, device=DEVICE)
    expected = out.clone()
    ops.token_csr.reference(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, expected)
    kernels_triton.build_token_indices(case.req_to_token, case.req_pool_indices, case.seq_lens, indptr, out)
    assert torch.equal(out.cpu(), expected.cpu())
