"""`python -m egf_audit`: the same as the `egf-audit` command."""

from .entry import main

main()
