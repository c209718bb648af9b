"""A VLM behind Triton's python backend, served by `lmdeploy.pipeline` and traced by vlmtrace.

Inputs `query` and `image` (encoded image bytes, e.g. a JPEG) per request, output `response`. The
requests Triton hands over in one `execute` (dynamic batching) go to the pipeline as one batch.
Parameters (config.pbtxt): `model_path`, `session_len`, and `empty_cache` ("true" calls
`torch.cuda.empty_cache()` after every batch: the usual workaround for growing memory; vlmtrace times
each call, so the trace shows what it costs). vlmtrace reads its options from the server's environment
(VLMTRACE_JOURNAL, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, ...).
"""

import io
import json

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image

import vlmtrace


def _parameter(config: dict, key: str, default: str) -> str:
    return config.get("parameters", {}).get(key, {}).get("string_value", default)


class TritonPythonModel:
    def initialize(self, args):
        vlmtrace.instrument()  # before the pipeline exists: its engine and vision encoder are traced from the start
        from lmdeploy import GenerationConfig, TurbomindEngineConfig, pipeline

        config = json.loads(args["model_config"])
        self.pipeline = pipeline(
            _parameter(config, "model_path", "openbmb/MiniCPM-V-2_6"),
            backend_config=TurbomindEngineConfig(
                session_len=int(_parameter(config, "session_len", "8192")),
                max_batch_size=max(1, int(config.get("max_batch_size", 1))),
            ),
        )
        self.gen_config = GenerationConfig(top_k=1, max_new_tokens=512)
        self.empty_cache = _parameter(config, "empty_cache", "false").lower() == "true"

    def execute(self, requests):
        prompts, responses = [], [None] * len(requests)
        for index, request in enumerate(requests):
            try:
                query = pb_utils.get_input_tensor_by_name(request, "query").as_numpy().reshape(-1)[0].decode()
                data = pb_utils.get_input_tensor_by_name(request, "image").as_numpy().reshape(-1)[0]
                image = Image.open(io.BytesIO(data)).convert("RGB")
            except Exception as error:  # noqa: BLE001 - a bad request fails alone, whatever PIL raised
                responses[index] = pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(f"bad input: {type(error).__name__}: {error}")
                )
                continue
            prompts.append(
                (
                    index,
                    [
                        {
                            "role": "user",
                            "content": [
                                {"type": "text", "text": query},
                                {"type": "image_data", "image_data": {"data": image, "max_slice_nums": 1}},
                            ],
                        }
                    ],
                )
            )
        if prompts:
            outputs = self.pipeline([messages for _, messages in prompts], gen_config=self.gen_config)
            for (index, _), output in zip(prompts, outputs, strict=True):
                text = np.array([output.text.encode()], dtype=np.object_).reshape(1, 1)
                responses[index] = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("response", text)])
        if self.empty_cache:
            import torch

            torch.cuda.empty_cache()
        return responses

    def finalize(self):
        self.pipeline.close()
        vlmtrace.uninstrument()  # flushes OTLP and closes the journal with its end marker
