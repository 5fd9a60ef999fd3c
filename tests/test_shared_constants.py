"""Values that Python, C and CUDA sources share are equal on every side.

``host_path.c`` takes its shared values only as ``-D`` options from ``host_path.shared_defines()``;
``kv_indices.cu`` keeps its own ``KV_*`` flag macros, read here from the source.
"""

import inspect
import re
import subprocess
import sysconfig

import pytest

from kernels_cupy import build as cupy_build
from kernels_cupy import launch as cupy_launch
from kernels_triton import crosscompile, page_table
from kvdispatch import dispatch, grid, host_path


def defined_values(options) -> dict[str, str]:
    """``{NAME: value}`` of ``-DNAME=value`` options."""
    return dict(option[2:].split("=", 1) for option in options)


def test_host_path_defines_match_the_python_constants():
    values = defined_values(host_path.shared_defines())
    assert values == {"OP_COUNT": str(len(host_path.OPS)), "LAUNCHER_COUNT": str(len(host_path.LAUNCHERS))}
    # The op codes index approved[OP_COUNT] in the C source, the launcher codes its entries: each counts from 0.
    # Every op is replayed (its outputs named), and the C source names none of them.
    assert sorted(host_path.OPS.values()) == list(range(len(host_path.OPS)))
    assert set(host_path.REPLAYED) == set(host_path.OPS) == set(dispatch.OPS)
    assert sorted(host_path.LAUNCHERS.values()) == list(range(len(host_path.LAUNCHERS)))
    source = host_path.SOURCE.read_text()
    assert not [op for op in host_path.OPS if op in source or op.upper() in source]


def test_host_path_source_defines_no_shared_value_itself():
    source = host_path.SOURCE.read_text()
    for name in defined_values(host_path.shared_defines()):
        assert not re.search(rf"^\s*#\s*define\s+{name}\b", source, re.MULTILINE), name
        assert re.search(rf"!defined\({name}\)", source), f"{name} has no #error guard"


def test_host_path_refuses_a_build_without_the_defines(tmp_path):
    if host_path.compiler() is None:
        pytest.skip("no C compiler")
    result = subprocess.run([host_path.compiler(), "-fsyntax-only", f"-I{sysconfig.get_paths()['include']}",
                             str(host_path.SOURCE)], capture_output=True, text=True)
    assert result.returncode != 0
    assert "built by kvdispatch/host_path.py" in result.stderr


def test_library_name_depends_on_the_defines(monkeypatch):
    before = host_path.library_name()
    monkeypatch.setitem(host_path.LAUNCHERS, "another", len(host_path.LAUNCHERS))
    assert host_path.library_name() != before


def test_cupy_flag_bits_match_the_cuda_macros():
    macros = {name: int(value) for name, value in
              re.findall(r"^#define KV_(\w+) (\d+)\b", cupy_build.SOURCE_PATH.read_text(), re.MULTILINE)}
    python = {name: getattr(cupy_launch, name) for name in
              ("WIDE_POOL", "WIDE_LENS", "WIDE_START", "WIDE_INDPTR", "FILL", "START", "LENS_OUT", "FOLDED_GRID",
               "WIDE_OUT", "MAPPING", "WIDE_MAPPING", "ROUND_TOWARD_ZERO", "POSITIONS", "WIDE_POSITIONS", "V2P",
               "WIDE_V2P", "INDPTR_START")}
    assert macros == python
    assert sorted(python.values()) == [1 << bit for bit in range(len(python))]  # distinct single bits


def test_block_sum_scratch_fits_every_program():
    """kv_block_sum's shared scratch holds a partial per thread of the largest program, and its second level's
    lanes are threads of the smallest."""
    constants = dict(re.findall(r"^constexpr int (kv_\w+) = (\d+);", cupy_build.source(), re.MULTILINE))
    assert int(constants["kv_max_threads"]) == grid.threads_per_program(1 << 30)
    assert int(constants["kv_block_sum_lanes"]) <= grid.threads_per_program(1)


def test_specialised_page_sizes_have_one_source():
    default = inspect.signature(crosscompile.specializations).parameters["page_sizes"].default
    assert default is page_table.SPECIALISED_PAGE_SIZES
    assert crosscompile.PAGE_SIZES is page_table.SPECIALISED_PAGE_SIZES
    assert all(1 <= size <= grid.MAX_PAGE_SIZE for size in page_table.SPECIALISED_PAGE_SIZES)


def test_every_cuda_launch_names_a_kernel_of_the_source():
    """The CuPy launchers name their kernels as ``kv_indices.cu`` does; ``build.KERNELS`` is read from it."""
    import re  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from kernels_cupy import build  # noqa: PLC0415

    launched = set(re.findall(r'_kernel_call\("(\w+)"', Path(build.__file__).with_name("launch.py").read_text()))
    assert launched == set(build.KERNELS) and len(build.KERNELS) == len(set(build.KERNELS))


@pytest.mark.parametrize("package", ["kernels_triton", "kernels_cupy"])
def test_kernel_tables_are_the_submodules_op_launchers(package):
    """Each backend's ``KERNELS``, read from its submodules' sources, names every op once and is what their
    ``OP_LAUNCHERS`` hold once imported; no submodule's table is missed."""
    import importlib  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    kernels = importlib.import_module(package).KERNELS
    assert set(kernels) == set(dispatch.OPS)
    modules = {name: importlib.import_module(f"{package}.{name}") for name, _ in kernels.values()}
    for name, module in modules.items():
        assert module.OP_LAUNCHERS == {key: getattr(module, launcher) for key, (owner, launcher) in kernels.items()
                                       if owner == name}
    sources = Path(importlib.import_module(package).__file__).parent.glob("*.py")
    assert {path.stem for path in sources if "\nOP_LAUNCHERS" in path.read_text()} == set(modules)


def test_asan_lane_sets_the_host_builds_flag_variable():
    """The cupy-host lane passes AddressSanitizer's options through the variable the host build reads."""
    import importlib.util
    from pathlib import Path

    import cuda_host

    path = Path(__file__).resolve().parents[1] / "ci" / "run_lane.py"
    spec = importlib.util.spec_from_file_location("run_lane", path)
    run_lane = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_lane)
    assert run_lane.HOST_BUILD_FLAGS_ENV == cuda_host.EXTRA_FLAGS_ENV
