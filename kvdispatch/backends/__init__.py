"""One descriptor module per backend: what it is called, which module implements its ops, and which
devices it can serve (with the reason when it cannot, naming the package to install where one is missing).

Each module defines ``NAME``, ``MODULE`` (imported at the first selection, providing ``build_page_table``
and ``build_token_indices``), ``install_hint(vendor) -> str | None`` and
``reason_if_unsupported(raw_device, family) -> str | None``. They import neither Triton nor CuPy nor the
implementing module, so ``dispatch.DESCRIPTORS`` can list them at ``import kvdispatch``.
"""
