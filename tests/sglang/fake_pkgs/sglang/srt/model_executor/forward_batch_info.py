"""Fake ``ForwardMode`` / ``ForwardBatch`` with SGLang 0.5.23's names and member values.

GPU-tensor fields hold :class:`DeviceTensor`, which raises on any use, so a test fails if a hook
reads them (a real hook doing so would force a device sync).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, auto
from typing import Any, List, Optional


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    MIXED = auto()
    IDLE = auto()
    TARGET_VERIFY = auto()
    DRAFT_EXTEND_V2 = auto()
    PREBUILT = auto()
    SPLIT_PREFILL = auto()
    DLLM_EXTEND = auto()

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_cuda_graph(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.IDLE, ForwardMode.DLLM_EXTEND)


class DeviceTensor:
    """Stands for a CUDA tensor: touching it is a test failure."""

    touched = 0

    def __getattr__(self, name: str) -> Any:
        DeviceTensor.touched += 1
        raise AssertionError(f"hook touched a GPU tensor (.{name})")

    def __len__(self) -> int:
        DeviceTensor.touched += 1
        raise AssertionError("hook touched a GPU tensor (len)")

    def __bool__(self) -> bool:
        DeviceTensor.touched += 1
        raise AssertionError("hook touched a GPU tensor (bool)")

    def __int__(self) -> int:
        DeviceTensor.touched += 1
        raise AssertionError("hook touched a GPU tensor (int)")

    def __index__(self) -> int:
        DeviceTensor.touched += 1
        raise AssertionError("hook touched a GPU tensor (index)")


@dataclass
class SpecInput:
    draft_token_num: int


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: Any
    req_pool_indices: Any
    seq_lens: Any
    out_cache_loc: Any
    seq_lens_sum: int
    extend_num_tokens: Optional[int] = None
    extend_seq_lens: Any = None
    extend_seq_lens_cpu: Optional[List[int]] = None
    positions: Any = None
    spec_info: Optional[SpecInput] = None
    can_run_decode_cuda_graph: bool = False


def make_batch(mode: ForwardMode, bs: int, extend_num_tokens: Optional[int] = None, draft_token_num: Optional[int] = None) -> ForwardBatch:
    t = DeviceTensor()
    return ForwardBatch(
        forward_mode=mode, batch_size=bs, input_ids=t, req_pool_indices=t, seq_lens=t, out_cache_loc=t,
        seq_lens_sum=bs * 100, extend_num_tokens=extend_num_tokens, extend_seq_lens=t, positions=t,
        spec_info=None if draft_token_num is None else SpecInput(draft_token_num),
    )
