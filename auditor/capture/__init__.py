"""Audit the trainer process itself: a CUPTI recorder injected into the trainer's own command
(`egf-audit capture`), and the invariants a capture can decide (`egf-audit run --capture`)."""
