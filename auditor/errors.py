"""The two error kinds a run can end with, and their exit codes (SPEC section 7), and how a
message is put on the one line an error or a reason is printed in."""


class UsageError(ValueError):
    """Bad usage or configuration: exit code 2."""


class AuditEnvironmentError(RuntimeError):
    """The environment cannot run the audit (no GPU, a kernel that does not compile, an output
    that cannot be written): exit code 3."""


def message_lines(message: object) -> list[str]:
    """The non-blank lines of a message, each stripped."""
    return [line.strip() for line in str(message).splitlines() if line.strip()]


def one_line(message: object) -> str:
    """A message as the one line `egf-audit: error: ...` prints: all of its lines, joined."""
    return " | ".join(message_lines(message)) or "(no message)"


def exception_line(exc: BaseException) -> str:
    """An exception as its type and its message's first line (`RuntimeError: CUDA error: ...`),
    for a reason printed in a table's cell, where a long traceback-like message would not fit
    (the bench's unavailable figures)."""
    lines = message_lines(exc)
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip().rstrip(":")
