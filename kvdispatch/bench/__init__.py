"""``kvdispatch bench``: every op through the public API, per backend, against baselines (``core.legend()``).

Imported only by ``kvdispatch bench`` (``kvdispatch.cli``), not by the package. ``core``: cases, inputs,
timing, CUDA-graph capture, rows, ratios, references, the run and its output; ``baselines``: the Triton
comparison kernels (SGLang's designs, a per-request loop); ``pdl``: ``--pdl-chain``.

One case module per op, named after the op's key in ``dispatch.OPS`` (``core.case_modules`` finds
them: a case ``OP:SHAPE`` is that module's; a bare ``BATCHxCONTEXTxPAGE``, the page table's). Each defines:

* ``parse(shape, text) -> core.Case``: ``shape`` what follows ``OP:`` (lower case, without ``:len=``), ``text``
  the whole case for messages; raises ``argparse.ArgumentTypeError``. ``shape_name(case)``: the inverse.
* ``make_inputs(case, device, seed) -> core.Inputs``: the op's buffers on a ``core.page_pool`` and the
  reference's result.
* ``bind(impl, x, case)``: a no-argument callable building ``x.out`` with ``impl``: an API row
  (``core.api_backend``), a variant in ``API_VARIANTS``, a Triton baseline, or ``core.PLAIN_TORCH`` (the
  module's ``plain_torch``, the few PyTorch ops an engine would write, or ``kvdispatch.reference``'s build).
* ``launch(case, x, budget) -> kvdispatch.grid.Launch``: the API's launch on the GPU backends, with the device's
  program budget (``grid.program_budget``): the programs column.
* ``TRITON_BASELINES`` (Triton launchers in ``baselines`` that return their grid), ``SGLANG_BASELINE`` (what
  ``/2d`` and ``host/launch`` divide by), ``IDEAL_BASELINE`` (``:len=`` cases only; None without one),
  optionally ``OPTION_BASELINES`` and ``option_baseline(case)``: the baselines of options SGLang builds with a
  kernel of its own, and the one a case of them has in place of ``TRITON_BASELINES`` (None: not such a case),
  ``API_VARIANTS`` (more rows through the API), ``PLAIN_TORCH_CASES``: ``"all"``, ``"full-length"`` (no
  ``:len=`` case) or ``"none"``.
* ``CASES``: its cases in each set ``core.case_set`` takes (``GPU``, ``GPU_QUICK``, ``GPU_REAL``, ``GPU_REAL_QUICK``,
  ``CPU``, ``CPU_QUICK``): the default and ``--quick`` runs on a GPU and on the CPU.
* ``LEGEND_CASE``, ``LEGEND_IMPLS``: what the legend (``core.legend()``) says of its cases and baselines.
* Optionally ``bytes_moved(case)``: bytes read and written per call, for ``GB/s`` (None: not shown).
"""
