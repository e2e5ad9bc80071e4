"""The trainer's own process, audited: a CUPTI recorder injected into the trainer's command
(`egf-audit capture`, or `capture --cpu` on egf-audit's CPU stand-ins for NVIDIA's libraries),
and a capture folder read into what a capture is (`model.py`: records, effects, snapshot
regions, the layout's buffers, call sites, the same `Trace` the rebuild records). One room,
below the invariants that judge what it reads: `egf-audit run --capture` runs them from
cli/capture_audit.py."""
