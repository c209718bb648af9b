"""The PyTorch engine's own process, on a CPU: LMDeploy's real multi-process plumbing around a stand-in Engine.

`lmdeploy serve api_server --backend pytorch` runs the engine in a process spawned by `ZMQMPEngine`;
requests cross over LMDeploy's real ZMQ RPC to the real `EngineWorkerBase`. What needs a GPU is
replaced, and nothing else:
- `ZMQMPEngine._mp_proc`'s `Engine.from_pretrained` (weights, KV cache) by `StandinEngine`, which
  schedules its sequences through LMDeploy's real `InputsMakerAsync._send_next_inputs_impl` and
  `BaseModelAgent.set_forward_inputs`, then calls `BaseModelAgent._async_step` per step;
- the model forward inside `_async_step` by a short sleep (swapped in underneath any wrapper on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

import torch
from lmdeploy.messages import EngineOutput, RequestMetrics, ResponseType, ScheduleMetrics
from lmdeploy.pytorch.engine.inputs_maker import InputsMakerAsync
from lmdeploy.pytorch.engine.model_agent.agent import BaseModelAgent
from lmdeploy.pytorch.model_inputs import ModelInputs

STEP_SECONDS = 0.002
FIRST_TOKEN = 100


async def _forward_without_gpu(self, inputs=None, delta=None, **kwargs):
    await asyncio.sleep(STEP_SECONDS)


def use_forward_without_gpu() -> None:
    """Replace the GPU forward; a wrapper on `_async_step` (vlmtrace's) stays and now wraps this one."""
    current = BaseModelAgent.__dict__["_async_step"]
    if hasattr(current, "__wrapped__"):
        current.__wrapped__ = _forward_without_gpu
    else:
        BaseModelAgent._async_step = _forward_without_gpu


@dataclasses.dataclass(eq=False)
class Sequence:
    session_id: int
    prompt_len: int
    remaining: int
    outputs: asyncio.Queue
    generated: int = 0
    logical_blocks: list = dataclasses.field(default_factory=lambda: [0])


class _Scheduler:
    def __init__(self) -> None:
        self.ticks = 0

    def resume_completed_migrations(self) -> None:
        pass

    def tick(self) -> None:
        self.ticks += 1


class _Executor:
    """UniExecutor.forward_async: hand the batch to the in-process agent."""

    def __init__(self, agent: BaseModelAgent) -> None:
        self.agent = agent

    async def forward_async(self, inputs) -> None:
        self.agent.set_forward_inputs(inputs)


def _model_inputs(batch: list[Sequence], prefill: bool) -> ModelInputs:
    lengths = [seq.prompt_len if prefill else 1 for seq in batch]
    history = [0 if prefill else seq.prompt_len + seq.generated for seq in batch]
    return ModelInputs(
        input_ids=torch.zeros((1, sum(lengths)), dtype=torch.long),
        seq_length=torch.tensor(lengths),
        history_lengths=torch.tensor(history),
        block_offsets=torch.zeros((len(batch), 1), dtype=torch.long),
        is_decoding=not prefill,
        num_ignored_history=torch.zeros(len(batch), dtype=torch.long),
        max_q_seqlen=max(lengths),
        max_kv_seqlen=max(h + n for h, n in zip(history, lengths)),
        sum_kv_seqlen=sum(h + n for h, n in zip(history, lengths)),
    )


class StandinEngine:
    """What `EngineWorkerBase` and `ZMQMPEngine._mp_proc_async` use of `lmdeploy.pytorch.engine.Engine`."""

    def __init__(self, engine_config) -> None:
        self.engine_config = engine_config
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self.agent = object.__new__(BaseModelAgent)
        self.maker = object.__new__(InputsMakerAsync)
        self.maker.scheduler = _Scheduler()
        self.maker.executor = _Executor(self.agent)
        self.maker.do_prefill = lambda: bool(self.waiting)
        self.maker._make_forward_inputs = self._make_forward_inputs

    def _make_forward_inputs(self, prefill: bool, enable_empty: bool):
        batch = self.waiting if prefill else self.running
        if not batch:
            return None
        if prefill:
            self.running.extend(self.waiting)
            self.waiting = []
        return dict(inputs=_model_inputs(batch, prefill), delta=None, running=list(batch))

    def start_loop(self) -> None:
        self._wake = asyncio.Event()
        self.agent._pre_in_que = asyncio.Queue()
        self._loop_task = asyncio.get_event_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            if not self.waiting and not self.running:
                # LMDeploy's loop prefetches the next batch after each step and finds none when idle.
                assert await self.maker._send_next_inputs_impl(enable_empty=True) == (None, None)
                await self._wake.wait()
                self._wake.clear()
                continue
            forward_inputs, batch = await self.maker._send_next_inputs_impl()
            if forward_inputs is None:
                continue
            await self.agent._async_step(**self.agent._pre_in_que.get_nowait())
            for seq in batch:
                seq.generated += 1
                seq.remaining -= 1
                status = ResponseType.SUCCESS if seq.remaining > 0 else ResponseType.FINISH
                if status is ResponseType.FINISH:
                    self.running.remove(seq)
                seq.outputs.put_nowait(
                    EngineOutput(
                        status, [FIRST_TOKEN + seq.generated], req_metrics=RequestMetrics(token_timestamp=time.time())
                    )
                )

    def add(self, session_id: int, prompt_len: int, max_new_tokens: int) -> Sequence:
        seq = Sequence(session_id, prompt_len, max(1, max_new_tokens), asyncio.Queue())
        self.waiting.append(seq)
        self._wake.set()
        return seq

    def create_instance(self, cuda_stream_id: int = 0):
        return StandinInstance(self)

    def get_engine_config(self):
        return self.engine_config

    def get_schedule_metrics(self):
        return ScheduleMetrics(
            active_seqs=len(self.running), waiting_seqs=len(self.waiting), scheduler_tick=self.maker.scheduler.ticks
        )

    def get_local_health_status(self) -> dict:
        return dict(alive=True, message="stand-in engine", schedule_metrics=self.get_schedule_metrics())

    def end_session(self, session_id: int):
        return ResponseType.SUCCESS

    def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()

    async def wait_tasks(self) -> None:
        if self._loop_task is not None:
            await asyncio.gather(self._loop_task, return_exceptions=True)


class StandinInstance:
    def __init__(self, engine: StandinEngine) -> None:
        self.engine = engine

    async def async_stream_infer(
        self,
        session_id,
        input_ids,
        gen_config=None,
        multimodal=None,
        adapter_name=None,
        notify_add_msg_func=None,
        **kwargs,
    ):
        max_new_tokens = getattr(gen_config, "max_new_tokens", None) or 8
        seq = self.engine.add(session_id, len(input_ids), max_new_tokens)
        if notify_add_msg_func is not None:
            notify_add_msg_func()
        while True:
            output = await seq.outputs.get()
            yield output
            if output.status != ResponseType.SUCCESS:
                return

    async def async_end(self, session_id):
        return ResponseType.SUCCESS

    async def async_cancel(self, session_id):
        return ResponseType.SUCCESS


def standin_mp_proc(
    shared_dict, condition, model_path, engine_config=None, log_level="WARNING", speculative_config=None, **kwargs
):
    """`ZMQMPEngine._mp_proc` with `Engine.from_pretrained` replaced by `StandinEngine`."""
    from lmdeploy.pytorch.engine.mp_engine.zmq_engine import ZMQMPEngine
    from lmdeploy.pytorch.engine.mp_engine.zmq_rpc import AsyncRPCServer

    use_forward_without_gpu()
    server = AsyncRPCServer()
    try:
        with condition:
            shared_dict["rpc_server_port"] = server.port
            condition.notify()
    except EOFError:
        # LMDeploy's race, not the stand-in's: once the port is in the dict, `_start_mp_proc` leaves its
        # `with mp.Manager()` block, and the manager can be gone before it answers this `release`.
        pass
    if engine_config is not None:
        engine_config.enable_mp_engine = False
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    with contextlib.suppress(KeyboardInterrupt):
        loop.run_until_complete(ZMQMPEngine._mp_proc_async(server, StandinEngine(engine_config)))


def use_standin_engine_process() -> None:
    """In the server process: `ZMQMPEngine` spawns `standin_mp_proc` instead of building the real Engine."""
    from lmdeploy.pytorch.engine.mp_engine.zmq_engine import ZMQMPEngine

    ZMQMPEngine._mp_proc = staticmethod(standin_mp_proc)
