"""Which requests record their stage detail (`detail_every`, docs/configuration.md).

Every request gets its request span, with its memory readings at its start and its end: the analyzer's
growth per request and its timeline need them all. A request's *detail* is the rest: the vision encoder's
and the TurboMind stream's spans under it, the readings where its prompt ended and where it answered, and
the sampling parameters read off its GenerationConfig. With `detail_every` K above 1, a request records its
detail while the process is young (its first YOUNG_REQUESTS requests),
while the capture controller suspects growth (or holds a capture window open), and 1 in K otherwise; the
others carry `vlmtrace.request.detail_skipped` and the analyzer leaves them out of its stage attribution.
The choice is made once, at the request's start, by a counter: no random numbers, and two reads of
plain attributes on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable

from vlmtrace import semconv as sc
from vlmtrace.analysis import rules

# Every request's detail for three times the analyzer's young process: the host rules that tell LMDeploy's
# warm-up from a leak read a young process's first requests by their stages and set them against the run's
# last third, so a run of this many requests is read whole.
YOUNG_REQUESTS = 3 * rules.YOUNG_REQUESTS


class DetailSampling:
    """Counts requests as they start and says whether each one records its detail."""

    __slots__ = ("_suspected", "every", "seen", "young")

    def __init__(self, every: int, suspected: Callable[[], bool] | None, young: int = YOUNG_REQUESTS) -> None:
        """`suspected`: whether growth is suspected now (None: never known, as without the capture
        controller: then past its young requests the process keeps 1 in `every`)."""
        self.every = every
        self.young = young
        self._suspected = suspected
        self.seen = 0  # requests started

    def detailed(self) -> bool:
        """Whether the request starting now records its detail. Requests start on LMDeploy's event loop;
        where two threads start one at once, the count may miss one, which moves only which request is
        the K-th."""
        seen = self.seen
        self.seen = seen + 1
        if seen < self.young or seen % self.every == 0:
            return True
        suspected = self._suspected
        return suspected is not None and suspected()


def declared(every: int, suspicion_known: bool, young: int = YOUNG_REQUESTS) -> dict[str, int | bool]:
    """The resource attributes that declare the sampling (the journal's header, the OTLP resource).
    `suspicion_known`: the capture controller judges growth live (`capture=auto` with a journal)."""
    return {
        sc.RESOURCE_DETAIL_EVERY: every,
        sc.RESOURCE_DETAIL_YOUNG: young,
        sc.RESOURCE_DETAIL_WHILE_SUSPECTED: suspicion_known,
    }
