"""A stand-in for `triton_python_backend_utils`, the module Triton's python backend gives a model.py.

Only what a model uses is here, with the real module's names and shapes: `Tensor(name, array)`,
`.as_numpy()`, `.name()`; `InferenceRequest` holding input tensors; `get_input_tensor_by_name`;
`InferenceResponse(output_tensors, error)` with `.output_tensors()`, `.has_error()`, `.error()`;
`TritonError(message)` with `.message()`; `get_output_tensor_by_name`.
"""

from __future__ import annotations

import types

import numpy as np


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name = name
        self._array = np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceRequest:
    def __init__(self, inputs: list[Tensor]) -> None:
        self._inputs = {tensor.name(): tensor for tensor in inputs}

    def inputs(self) -> list[Tensor]:
        return list(self._inputs.values())


class TritonError:
    def __init__(self, message: str) -> None:
        self._message = message

    def message(self) -> str:
        return self._message


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor], error: TritonError | None = None) -> None:
        self._outputs = list(output_tensors)
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return request._inputs.get(name)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((tensor for tensor in response.output_tensors() if tensor.name() == name), None)


def as_module() -> types.ModuleType:
    """This stand-in under the real module's name, for `import triton_python_backend_utils as pb_utils`."""
    module = types.ModuleType("triton_python_backend_utils")
    for name in (
        "Tensor",
        "InferenceRequest",
        "TritonError",
        "InferenceResponse",
        "get_input_tensor_by_name",
        "get_output_tensor_by_name",
    ):
        setattr(module, name, globals()[name])
    return module
