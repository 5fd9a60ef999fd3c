"""Drop-ins for SGLang 0.5.23's ``sglang.srt.layers``, under ``kvdispatch.compat``."""
