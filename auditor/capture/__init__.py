"""The trainer's own process, audited: a CUPTI recorder injected into the trainer's command
(`egf-audit capture`, or `capture --cpu` on egf-audit's CPU stand-ins for NVIDIA's libraries),
and a capture folder read into the trace model (egf_audit.trace: the same `Trace` the rebuild
records, with what only a capture holds, records, effects, snapshot regions and the layout's
buffers, carried on it). One room,
below the invariants that judge what it reads: `egf-audit run --capture` runs them from
cli/capture_audit.py."""
