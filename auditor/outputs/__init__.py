"""Where a run's outputs reach the disk: every file written atomically (`atomic`) and the job's
step summary appended (`step_summary`).

The command line, the bench and the capture write through here; `reports/` only renders text
and never imports this package, so a renderer can be called (and tested) without touching a
file.
"""
