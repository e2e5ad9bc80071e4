"""egf-audit: audits the hand-wired SP14 DQN trainer's wiring (K vs LDA, the wire gate, the
target net) by running its pipeline with every launch recorded."""

__version__ = "0.1.0"
