"""Passwords in database URLs never leave the process: every message bench.py prints goes through
`scrub`, which hides the password of any URL in it (the library's own messages already show
`Store.display_url`; this catches what a driver or a library embeds on its own)."""

from __future__ import annotations

import re

# scheme://user:password@  ->  scheme://user:***@   (the password may hold anything but '@' and blanks)
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*):[^@\s]*@")
# libpq keyword form: password=... or password='...'
_DSN_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def scrub(text: str) -> str:
    """TEXT with every URL's password and every libpq `password=` value replaced by ***."""
    return _DSN_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1:***@", text))
