"""Judging a finished report: health findings (``health``), signature findings (``signature_rules``), the verdict
(``verdict``) and its prescription (``prescribe``)."""
