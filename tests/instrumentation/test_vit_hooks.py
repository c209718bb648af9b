"""The torch ViT forward as a span: forward hooks on a real torch module, on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.instrumentation.conftest import parent_of, spans_by_name
from vlmtrace import semconv as sc
from vlmtrace.instrumentation.vision import VitHooks, find_vit_module


class TinyVit(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(12, 8)

    def forward(self, pixel_values, grid_thw=None):
        if pixel_values.shape[0] == 0:
            raise ValueError("no patches")
        return self.proj(pixel_values)


class TinyVlm(nn.Module):
    def __init__(self):
        super().__init__()
        self.visual = TinyVit()
        self.lm_head = nn.Linear(8, 4)


class Agent:
    """Stands in for BaseModelAgent: `patched_model` is a graph runner around the model."""

    def __init__(self):
        self.patched_model = type("GraphRunner", (), {"model": TinyVlm()})()


def test_vit_module_is_found_through_wrappers():
    runner = type("GraphRunner", (), {"model": TinyVlm()})()
    assert isinstance(find_vit_module(runner), TinyVit)
    assert find_vit_module(nn.Linear(2, 2)) is None


def test_each_vit_forward_is_a_child_span_with_its_input_shape(traced, exporter):
    hooks = VitHooks(traced.telemetry)
    agent = Agent()
    hooks.attach_once(agent, "patched_model")
    hooks.attach_once(agent, "patched_model")  # once per agent: one span per forward, not two
    vit = agent.patched_model.model.visual
    tracer = traced.tracing.provider().get_tracer("test")
    with tracer.start_as_current_span("engine step"):
        vit(torch.ones(16, 12))
        with pytest.raises(ValueError):
            vit(torch.ones(0, 12))
    spans = spans_by_name(exporter)[sc.SPAN_VISION_FORWARD]
    assert [tuple(s.attributes[sc.VISION_INPUT_SHAPE]) for s in spans] == [(16, 12), (0, 12)]
    assert {parent_of(s, exporter).name for s in spans} == {"engine step"}
    assert spans[0].attributes[sc.VISION_MODULE] == "TinyVit"
    hooks.remove()
    vit(torch.ones(4, 12))
    assert len(spans_by_name(exporter)[sc.SPAN_VISION_FORWARD]) == 2
