"""The two error kinds a run can end with, and their exit codes (SPEC section 7)."""


class UsageError(ValueError):
    """Bad usage or configuration: exit code 2."""


class AuditEnvironmentError(RuntimeError):
    """The environment cannot run the audit (no GPU, a kernel that does not compile, an output
    that cannot be written): exit code 3."""
