"""`vlmtrace top --once` reading the journal of LMDeploy 0.18's real pipeline (stand-in TurboMind on the
CPU) while it serves: six completed requests, then one request held inside its engine stream, then the clean end."""

from __future__ import annotations

import threading

import pytest
from lmdeploy import GenerationConfig
from opentelemetry.sdk.trace import TracerProvider
from typer.testing import CliRunner

import vlmtrace
from tests.instrumentation.conftest import image, standin_engines  # noqa: F401 - fixture
from tests.support import turbomind_native
from tests.support.cpu_lmdeploy import standin_pipeline
from vlmtrace import semconv as sc
from vlmtrace.analysis.follow import JournalFollower
from vlmtrace.analysis.live import live_view
from vlmtrace.cli.main import app

GEN = GenerationConfig(max_new_tokens=4, top_k=1)


class HeldEngine:
    """Holds the next request the stand-in engine is given until released: a request in flight, on cue."""

    def __init__(self, monkeypatch) -> None:
        self.armed, self.entered, self.release = False, threading.Event(), threading.Event()
        forward = turbomind_native.ModelRequest.forward

        def held(request, *args, **kwargs):
            if self.armed:
                self.armed = False
                self.entered.set()
                self.release.wait(120)
            return forward(request, *args, **kwargs)

        monkeypatch.setattr(turbomind_native.ModelRequest, "forward", held)


@pytest.mark.lmdeploy
def test_top_follows_a_real_pipeline_while_it_serves(standin_engines, tmp_path, monkeypatch):  # noqa: F811
    journal = tmp_path / "journal"
    engine = HeldEngine(monkeypatch)
    session = vlmtrace.instrument(tracer_provider=TracerProvider(), journal=str(journal), sample_interval_ms=20)
    follower = JournalFollower(str(journal))  # one follower across the run, as `top` keeps one
    try:
        pipe = standin_pipeline()
        pipe([("describe this image", image(64 + 8 * i, 48, i)) for i in range(6)], gen_config=GEN)
        engine.armed = True
        worker = threading.Thread(target=pipe, args=([("and this one", image(80, 64, 9))],), kwargs={"gen_config": GEN})
        worker.start()
        assert engine.entered.wait(120)
        assert session.tracing.journal.flush()  # what was queued when the request was held, into the file
        frame = CliRunner().invoke(app, ["top", str(journal), "--once"])
        follower.poll()
        (running,) = live_view(follower).running
        engine.release.set()
        worker.join(120)
        pipe.close()
    finally:
        engine.release.set()
        vlmtrace.uninstrument()
    assert frame.exit_code == 0, frame.output
    assert "6 requests completed" in frame.output and ", 1 in flight" in frame.output
    assert running.state.requests_completed == 6 and running.requests_in_flight == 1
    stages = {span.stage for span in running.oldest_in_flight}
    assert {sc.STAGE_PIPELINE, sc.STAGE_REQUEST, sc.STAGE_ENGINE_STREAM} <= stages, running.oldest_in_flight
    (host,) = [item for item in running.components if item.level is not None]  # on a CPU the sampler reads RSS only
    assert host.component == "host" and host.klass is not None and host.fit.points == 6
    assert "host memory (RSS)" in frame.output and "too few requests yet" not in frame.output
    follower.poll()
    view = live_view(follower)
    assert view.running == [] and [p.requests_completed for p in view.ended] == [7] and view.last_crash is None
