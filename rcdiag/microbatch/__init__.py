"""How verl cuts a step into data-parallel ranks, mini-batches and micro-batches, and what it computes (and
where it crashes) per micro-batch. Used by ``analyze`` with micro-batch options (docs/verl-differences.md)."""

from rcdiag.microbatch.plan import MicroBatchSettings
from rcdiag.records.report import MicroBatchReport

__all__ = ["MicroBatchReport", "MicroBatchSettings"]
