"""The A/B and evidence stack (docs/architecture.md, "Jobs and evidence"): what a job file
says and what its runs report (``jobs.py``), a device's fingerprint and readings at a run's
start (``fingerprint.py``), the analysis of a job's runs (``abstats.py``), the evidence made
of them (``evidence.py``) and their charts (``charts.py``). The rest of ``core/`` is the
shared mechanics."""
