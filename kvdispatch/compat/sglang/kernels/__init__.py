"""Drop-ins for SGLang 0.5.23's ``sglang.kernels``, under ``kvdispatch.compat``."""
