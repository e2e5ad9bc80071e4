"""The trace model: what the rebuild's recorder (egf_audit.runtime) and the capture's reader
(egf_audit.capture) both produce, and the invariants read. A `Trace` is one recording: its
launches with their bindings and observed effects, its steps and call sites; what only one source
holds is data on it (a rebuild scenario's checkpoint snapshots, a captured process's records,
layout, allocations, snapshot regions and observed effects: `Trace.captured`). The contract's
names and the config view every side reads live here too, so the rooms above agree on them
without importing one another."""
