"""Untrusted text shown as it is written: control, format and bidi characters escaped.

Names reach the reports from files the audited trainer wrote: a layout file's buffer and tensor
names, a kernel's symbol, the recorder's notes. A raw ESC sequence, a BEL, a NUL or a bidi
override (U+202E) among them would drive a terminal, hide text, or reorder what a reviewer reads,
in the document as in the JSON, the JUnit XML or a GitHub annotation. `visible` writes each such
character (Unicode categories Cc, Cf, Zl, Zp and lone surrogates) as an escape, `\\x1b`,
`\\u202e`, `\\U000e0041`, the same way for every renderer; every other character, a backslash
included, stays as it is. Text egf-audit writes itself holds none of them, so it is unchanged.
"""

from __future__ import annotations

import unicodedata

_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str) -> str:
    """`text` with every control, format, line-separator and bidi character escaped."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(_escape(c) if unicodedata.category(c) in _HIDDEN else c for c in text)
