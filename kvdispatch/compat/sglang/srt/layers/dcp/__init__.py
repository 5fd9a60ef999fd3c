"""Drop-ins for SGLang 0.5.23's ``sglang.srt.layers.dcp``, under ``kvdispatch.compat``."""
