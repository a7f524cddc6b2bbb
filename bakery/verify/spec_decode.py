"""vLLM's speculative-decoding counters, read from a server's ``/metrics``.

The one place that knows their names. vLLM counts verified drafts, their tokens and
the accepted ones (``vllm:spec_decode_num_*_total``, per engine); a capture reads them
around each case's generation request, one request in flight, so a case's difference is
that case's own. Parsed by prometheus_client's reader of the text format.
"""

from __future__ import annotations

import asyncio
import math

from prometheus_client.parser import text_string_to_metric_families

from bakery.schema import Document
from bakery.verify.errors import CaptureError

__all__ = ["SpecCounts", "SpecCase", "parse_counts", "settled_counts"]

METRICS_PATH = "/metrics"
# field -> vLLM's counter (the family name; its samples end in _total)
COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
}
# A count still on its way to the API server when the answer arrives would be cut off:
# read until two reads this far apart agree.
SETTLE_S = 0.2
SETTLE_READS = 50


class SpecCounts(Document, frozen=True):
    drafts: int
    draft_tokens: int
    accepted: int

    def minus(self, earlier: SpecCounts) -> SpecCounts:
        return SpecCounts(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted - earlier.accepted,
        )

    @classmethod
    def total(cls, counts) -> SpecCounts:
        every = list(counts)
        return cls(
            sum(c.drafts for c in every),
            sum(c.draft_tokens for c in every),
            sum(c.accepted for c in every),
        )

    @property
    def acceptance(self) -> float | None:
        """Accepted over drafted tokens (None: nothing drafted)."""
        return self.accepted / self.draft_tokens if self.draft_tokens else None


class SpecCase(Document, frozen=True):
    """One suite case's counts in bundle.json, with the records it produced (a batch's
    members share one request, so one count)."""

    records: tuple[str, ...]
    counts: SpecCounts


def parse_counts(text: str | None) -> SpecCounts | None:
    """The counters summed over engines; None where the server has none (no drafts, or
    no ``/metrics``: ``text`` None)."""
    if text is None:
        return None
    totals: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise CaptureError(f"{METRICS_PATH} is not Prometheus text: {exc}") from None
    for family in families:
        for field, name in COUNTERS.items():
            # the reader names a counter's family without _total (from "# TYPE name_total
            # counter", as vLLM writes it) or with it (from "# TYPE name counter")
            if family.name in (name, name + "_total"):
                samples = [s.value for s in family.samples if s.name == name + "_total"]
                totals[field] = totals.get(field, 0.0) + sum(samples)
    if not totals:
        return None
    missing = set(COUNTERS) - set(totals)
    if missing:
        raise CaptureError(
            f"{METRICS_PATH} has some speculative-decoding counters, not {sorted(missing)}"
        )
    odd = {k: v for k, v in totals.items() if not (math.isfinite(v) and v >= 0 and v == int(v))}
    if odd:
        raise CaptureError(f"{METRICS_PATH} counts no whole number of drafts: {odd}")
    return SpecCounts(**{k: int(v) for k, v in totals.items()})


async def settled_counts(read) -> SpecCounts | None:
    """``parse_counts`` of ``await read()`` once two reads ``SETTLE_S`` apart agree
    (None at once for a server without the counters)."""
    last = parse_counts(await read())
    if last is None:
        return None
    for _ in range(SETTLE_READS):
        await asyncio.sleep(SETTLE_S)
        now = parse_counts(await read())
        if now == last:
            return now
        last = now
    raise CaptureError(
        f"vLLM's speculative-decoding counters kept moving for {SETTLE_S * SETTLE_READS:g} s "
        "with no request in flight"
    )
