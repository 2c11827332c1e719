"""``rcdiag watch``: follow a run's dump directory live, report each step, alert, forecast crossings (docs/watch.md).

``Watch`` (session.py) reads each new complete file once (files.py) into a persisted state; ``AlertPolicy``
(alerts.py) turns findings, ``check`` rules and trend forecasts (forecast.py) into alerts, which ``Dispatcher``
(deliver.py) hands to a command and a webhook without blocking the watch.
"""

from __future__ import annotations

from rcdiag.watch.alerts import Alert, AlertPolicy
from rcdiag.watch.deliver import Delivery, Dispatcher
from rcdiag.watch.files import FileChange
from rcdiag.watch.forecast import Forecast, NoTrend, forecast_crossing, trend
from rcdiag.watch.session import ReportEvent, StepEvent, Watch, default_state_path

__all__ = [
    "Alert",
    "AlertPolicy",
    "Delivery",
    "Dispatcher",
    "FileChange",
    "Forecast",
    "NoTrend",
    "ReportEvent",
    "StepEvent",
    "Watch",
    "default_state_path",
    "forecast_crossing",
    "trend",
]
