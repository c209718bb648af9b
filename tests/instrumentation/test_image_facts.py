"""The images a request's messages hold, read once on the event loop: the compiled core's walk gives what
the Python path gives (the count, and the sizes of the images that have one), for every shape of message
LMDeploy accepts and for malformed ones."""

from __future__ import annotations

import pytest
from PIL import Image

from vlmtrace import compiled
from vlmtrace.instrumentation.inputs import _image_facts_in_python

IMAGE = Image.new("RGB", (30, 20))


class Sized:
    size = (3, 4)


class FloatSized:
    size = (3.0, 4)


MESSAGES = [
    None,
    "text",
    [],
    [{"role": "user", "content": "hi"}],
    [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image", "image": IMAGE}]}],
    [{"content": [{"type": "image_url", "image_url": {"url": "http://x"}}, {"type": "image_data", "data": IMAGE}]}],
    [
        {
            "content": [
                {"type": "image", "data": None, "image": Sized()},
                {"type": "image_url", "image_url": {"data": FloatSized()}},
            ]
        }
    ],
    [{"content": [{"type": "image"}, {"type": 3}, "text", {"type": "image_url", "image_url": {}}]}],
    [1, {"content": [{"type": "image", "image": IMAGE}] * 3}, {"content": None}],
]


@pytest.mark.parametrize("messages", MESSAGES)
def test_the_compiled_walk_reads_what_the_python_path_reads(messages):
    core = compiled.core()
    assert core is not None, "the compiled core is built with the installation: pip install -e ."
    assert core.image_sizes(messages) == _image_facts_in_python(messages)


def test_three_images_of_which_two_have_a_size():
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": IMAGE},
                {"type": "image_url", "image_url": {"url": "u"}},
                {"type": "image", "image": Sized()},
            ],
        }
    ]
    assert compiled.core().image_sizes(messages) == (3, [(30, 20), (3, 4)])
