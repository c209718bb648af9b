"""A stand-in for the native `_turbomind` module of LMDeploy 0.4–0.6.4, which needs CUDA.

Those releases do `sys.path.append(<lmdeploy>/lib); import _turbomind as _tm` and drive a model
instance per request slot: `forward(inputs, instance_comm)` blocks on an executor thread while the
engine generates, calling the registered callback with the outputs so far. This stand-in answers
the same way (the prompt, then one token per step), so `TurboMindInstance.async_stream_infer`
(real Python) streams as it does on a GPU. Everything else the module is only named for (enums,
annotations, the weight-loading classes that need CUDA) comes from module `__getattr__`.
"""

from __future__ import annotations

import time

import torch

from tests.support.turbomind_native import DataType, TensorMap, from_dlpack  # noqa: F401 - the module's API

FIRST_TOKEN = 100  # inside the tiny tokenizer's vocabulary, clear of its special tokens


class ModelInstance:
    """One request slot (`model_comm.create_model_instance`)."""

    def __init__(self, comm: ModelComm) -> None:
        self._comm = comm
        self._callback = None

    def register_callback(self, callback) -> None:
        self._callback = callback

    def unregister_callback(self) -> None:
        self._callback = None

    def forward(self, inputs: TensorMap, instance_comm) -> TensorMap:
        input_len = int(inputs["input_lengths"][0])
        prompt = torch.as_tensor(inputs["input_ids"])[0, :input_len]
        stop = int(inputs["STOP"][0]) if "STOP" in inputs else 0
        new_tokens = 0 if stop else int(inputs["request_output_len"][0])
        self._comm.seen_inputs.append(
            {"session": int(inputs["CORRID"][0]), "input_len": input_len, "embeddings": "input_embeddings" in inputs}
        )
        output_ids = torch.zeros((1, 1, input_len + new_tokens), dtype=torch.int32)
        output_ids[0, 0, :input_len] = prompt
        for step in range(new_tokens):
            time.sleep(self._comm.token_seconds)
            output_ids[0, 0, input_len + step] = FIRST_TOKEN + step
            if self._callback is not None:
                self._callback(self._outputs(output_ids, input_len + step + 1), None)
        return self._outputs(output_ids, input_len + new_tokens)

    @staticmethod
    def _outputs(output_ids: torch.Tensor, length: int) -> TensorMap:
        return TensorMap(output_ids=output_ids.clone(), sequence_length=torch.tensor([[length]], dtype=torch.int32))


class ModelComm:
    """The engine handle (`TurboMind.model_comm`)."""

    def __init__(self, token_seconds: float = 0.001) -> None:
        self.token_seconds = token_seconds
        self.seen_inputs: list[dict] = []

    def create_model_instance(self, device_id, rank, cuda_stream_id, nccl_params) -> ModelInstance:
        return ModelInstance(self)

    def create_instance_comm(self, gpu_count):
        return None


_placeholders: dict[str, type] = {}


def __getattr__(name: str) -> type:
    if name.startswith("__"):
        raise AttributeError(name)
    if name not in _placeholders:
        _placeholders[name] = type(DataType)(name, (), {"__init__": lambda self, *a, **k: None})
    return _placeholders[name]
