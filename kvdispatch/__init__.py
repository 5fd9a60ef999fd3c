"""kvdispatch: KV-cache index tables for LLM decode, on the fastest backend the device has.

``import kvdispatch`` touches no device: the probe runs at first use, once per device. It registers every
public builder as a PyTorch custom op, ``torch.ops.kvdispatch.<public name>`` (``kvdispatch.ops``).
"""

from __future__ import annotations

from . import grid
from . import ops  # noqa: F401  (imported for its effect: registers torch.ops.kvdispatch.*, touching no device)
from .api import (create_dcp_kv_indices, create_dcp_page_table, create_draft_decode_kv_indices,
                  create_flashinfer_kv_indices, create_flashmla_kv_indices, create_translated_page_table,
                  create_trtllm_mha_page_table, dcp_local_lengths)
from .dispatch import BackendUnavailableError, available_backends, reset, select_backend
from .devices import DeviceInfo, probe

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError",
    "DeviceInfo",
    "available_backends",
    "create_dcp_kv_indices",
    "create_dcp_page_table",
    "create_draft_decode_kv_indices",
    "create_flashinfer_kv_indices",
    "create_flashmla_kv_indices",
    "create_translated_page_table",
    "create_trtllm_mha_page_table",
    "dcp_local_lengths",
    "grid",
    "probe",
    "reset",
    "select_backend",
]
