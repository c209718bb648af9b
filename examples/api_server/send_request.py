"""Send one OpenAI-style chat request with an image and a W3C traceparent to an LMDeploy api_server.

    python send_request.py [--base-url http://127.0.0.1:23333] [--image cat.jpg] [--stream]

Prints the answer and the trace id to look up in Jaeger (http://localhost:16686/trace/<id>) or Grafana
(Explore → Tempo). The traceparent makes this client's span (which it does not record) the parent of
the server's HTTP span, as an instrumented caller would.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import mimetypes
import secrets
import sys
import urllib.request


def image_data_url(path: str | None) -> str:
    if path:
        kind = mimetypes.guess_type(path)[0] or "image/jpeg"
        with open(path, "rb") as image:
            return f"data:{kind};base64," + base64.b64encode(image.read()).decode()
    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (240, 320, 3), dtype=np.uint8)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:23333")
    parser.add_argument("--image", help="an image file (default: a generated one)")
    parser.add_argument("--prompt", default="Describe this image.")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args(argv)

    with urllib.request.urlopen(f"{args.base_url}/v1/models", timeout=10) as response:
        model = json.loads(response.read())["data"][0]["id"]
    trace_id = secrets.token_hex(16)
    body = {
        "model": model,
        "max_tokens": args.max_tokens,
        "stream": args.stream,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": args.prompt},
                    {"type": "image_url", "image_url": {"url": image_data_url(args.image)}},
                ],
            }
        ],
    }
    request = urllib.request.Request(
        f"{args.base_url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        text = response.read().decode()
    if args.stream:
        chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        answer = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    else:
        answer = json.loads(text)["choices"][0]["message"]["content"]
    print(f"answer: {answer!r}")
    print(f"trace id: {trace_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
