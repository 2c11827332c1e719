"""The frozen records a run returns and every renderer reads (``report``)."""
