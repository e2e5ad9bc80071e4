"""Command line (placeholder until the CLI lands)."""


def main() -> None:
    raise SystemExit(0)
