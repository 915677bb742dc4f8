"""Fake ``ModelRunner`` at SGLang's real dotted path with 0.5.23's ``forward`` signature."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

IMPORT_COUNT = 0
IMPORT_COUNT += 1


@dataclass
class ModelRunnerOutput:
    logits_output: Any
    can_run_graph: bool
    expert_distribution_metrics: Any = None
    routed_experts_output: Any = None
    indexer_topk_output: Any = None


class ModelRunner:
    def __init__(self, tp_rank: int = 0, is_draft_worker: bool = False, sleep_s: float = 0.0) -> None:
        self.tp_rank = tp_rank
        self.is_draft_worker = is_draft_worker
        self.forward_pass_id = 0
        self.sleep_s = sleep_s
        self.calls: list[tuple[Any, ...]] = []

    def forward(
        self,
        forward_batch: ForwardBatch,
        skip_attn_backend_init: Optional[bool] = None,
        pp_proxy_tensors: Optional[Any] = None,
        reinit_attn_backend: bool = False,
        split_forward_count: int = 1,
    ) -> ModelRunnerOutput:
        self.forward_pass_id += 1
        self.calls.append((forward_batch, skip_attn_backend_init, pp_proxy_tensors, reinit_attn_backend, split_forward_count))
        if self.sleep_s:
            time.sleep(self.sleep_s)
        graph = forward_batch.forward_mode.is_cuda_graph() and forward_batch.batch_size <= 64
        return ModelRunnerOutput(logits_output=("logits", self.forward_pass_id), can_run_graph=graph)
