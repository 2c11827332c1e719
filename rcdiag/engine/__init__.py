"""The streaming engine: chunks to per-step accumulators (``stream``), parts read in parallel by processes or Ray
(``parallel``), and saved states (``state_files``)."""
