"""Drop-ins for SGLang 0.5.23's ``sglang.srt.speculative``, under ``kvdispatch.compat``."""
