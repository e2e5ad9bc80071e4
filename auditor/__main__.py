"""`python -m egf_audit`: the same as the `egf-audit` command."""

from egf_audit.entry import main

main()
