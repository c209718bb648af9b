"""0.4–0.6.4's PyTorch engine step (`Engine._async_model_forward`, the release's own code) over a
stand-in model agent, the GPU part: a trace of its own, linked to the requests of its sequences.
(0.12+ engine steps: tests/instrumentation/test_pytorch_engine.py on 0.18.)"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import types

import pytest
import torch

from tests.matrix.release.this_release import LEGACY
from tests.support.spans import spans_by_name
from vlmtrace import semconv as sc
from vlmtrace.instrumentation.runtime import RequestState

pytestmark = pytest.mark.skipif(not LEGACY, reason="Engine._async_model_forward is the step only up to 0.6.4")

HIDDEN = 8


class StandinAgent:
    """The model agent's forward runs the model on the GPU: answer with zeros of the right shape."""

    def __init__(self) -> None:
        self.calls = 0

    async def async_forward(self, inputs, swap_in_map, swap_out_map):
        self.calls += 1
        states = torch.zeros((1, inputs.input_ids.shape[-1], HIDDEN))
        return {"hidden_states": states, "logits": states}

    def get_logits(self, hidden_states):
        return hidden_states


def _model_inputs(lengths: list[int]):
    """The release's own `ModelInputs` (its fields moved between releases) for a prefill batch."""
    try:
        from lmdeploy.pytorch.model_inputs import ModelInputs
    except ImportError:
        from lmdeploy.pytorch.engine.model_agent import ModelInputs
    count = len(lengths)
    values = dict(
        input_ids=torch.zeros((1, sum(lengths)), dtype=torch.long),
        seq_length=torch.tensor(lengths),
        history_lengths=torch.zeros(count, dtype=torch.long),
        block_offsets=torch.zeros((count, 4), dtype=torch.long),
        is_decoding=False,
        num_ignored_history=torch.zeros(count, dtype=torch.long),
        max_q_seq_length=max(lengths),
        max_history_length=0,
    )
    return ModelInputs(**{f.name: values[f.name] for f in dataclasses.fields(ModelInputs) if f.name in values})


def test_a_step_is_a_trace_of_its_own_linked_to_its_requests(traced, exporter):
    from lmdeploy.pytorch.engine.engine import Engine

    engine = object.__new__(Engine)
    engine.cache_config = types.SimpleNamespace(max_prefill_token_num=4096, block_size=64)
    engine.model_agent = StandinAgent()
    engine._running = [
        types.SimpleNamespace(session_id=7, logical_blocks=[0] * 3),
        types.SimpleNamespace(session_id=8, logical_blocks=[0] * 2),
    ]
    telemetry = traced.telemetry
    for session_id in (7, 8):
        telemetry.requests.put(session_id, RequestState(telemetry.start(f"chat {session_id}", sc.STAGE_REQUEST)))

    options = (
        {"return_logits": False} if "return_logits" in inspect.signature(Engine._async_model_forward).parameters else {}
    )  # 0.6 added it
    output = asyncio.run(
        engine._async_model_forward(_model_inputs([20, 12]), swap_in_map={}, swap_out_map={}, **options)
    )
    assert engine.model_agent.calls == 1
    assert "logits" in output

    (step,) = spans_by_name(exporter)[sc.SPAN_PYTORCH_FORWARD]
    assert step.parent is None
    a = step.attributes
    assert a[sc.STAGE] == sc.STAGE_ENGINE_FORWARD
    assert a[sc.STEP_KIND] == "prefill"
    assert a[sc.STEP_SEQUENCES] == 2
    assert a[sc.STEP_TOKENS] == 32
    assert tuple(a[sc.STEP_SESSION_IDS]) == (7, 8)
    assert a[sc.STEP_KV_BLOCKS] == 5
    assert {link.context.span_id for link in step.links} == {
        telemetry.requests.get(sid).handle.span_context.span_id for sid in (7, 8)
    }
