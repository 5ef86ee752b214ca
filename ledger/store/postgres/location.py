"""Ledger locations as they may be shown or stored: `shown_location`, the one way out.

A ledger is a file path, or a PostgreSQL database named the way libpq names one: a
``postgresql://`` URL, or a keyword/value string (``host=db dbname=ledger user=me``).
Either can carry a password, and libpq accepts a password holding ``?``, ``#`` or ``:``
unencoded in a URL, which Python's ``urlsplit`` reads differently. So nothing here splits
a URL by hand: `shown_location` reads it with libpq's own parser (psycopg's
``pq.Conninfo.parse``, the one ``psycopg.connect`` uses) and writes it back from the
parsed values, each value libpq marks as a secret (the password, the SSL key's
password, ...) replaced by ``***``. Every message, report and file that names a ledger
names it through `shown_location`.

When libpq cannot be asked (psycopg is not installed: the ``[postgres]`` extra), or it
refuses the text, or the URL is ambiguous (an unencoded ``@`` besides the one ending the
user info, or a ``/`` before it: libpq would read part of the password as the host), the
location is masked conservatively instead: everything between ``//`` and the last ``@``
is hidden, and so is the value of every secret keyword. `check_url` refuses an ambiguous
URL before any connection is made (libpq would look a piece of the password up as a
host name).

This module imports psycopg only inside `_libpq_parse`, so the core imports without it.
"""

from __future__ import annotations

import os
import re
from typing import Final
from urllib.parse import quote, unquote

from ...errors import InvalidInput

#: URL schemes a PostgreSQL ledger is named by.
SCHEMES: Final = ("postgresql", "postgres")
#: What a secret is shown as.
MASK: Final = "***"
#: libpq's connection keywords (libpq 18), to tell a keyword/value string from a file
#: path without libpq (the choice must not depend on whether psycopg is installed).
KEYWORDS: Final = frozenset({
    "service", "user", "password", "passfile", "channel_binding", "connect_timeout",
    "dbname", "host", "hostaddr", "port", "client_encoding", "options", "application_name",
    "fallback_application_name", "keepalives", "keepalives_idle", "keepalives_interval",
    "keepalives_count", "tcp_user_timeout", "sslmode", "sslnegotiation", "sslcompression",
    "sslcert", "sslkey", "sslcertmode", "sslpassword", "sslrootcert", "sslcrl", "sslcrldir",
    "sslsni", "requirepeer", "require_auth", "min_protocol_version", "max_protocol_version",
    "ssl_min_protocol_version", "ssl_max_protocol_version", "gssencmode", "krbsrvname",
    "gsslib", "gssdelegation", "replication", "target_session_attrs", "load_balance_hosts",
    "scram_client_key", "scram_server_key", "oauth_issuer", "oauth_client_id",
    "oauth_client_secret", "oauth_scope", "sslkeylogfile", "requiressl", "authtype", "tty"})
#: The keywords whose values are secrets when libpq cannot say (libpq marks them: its
#: ``dispchar`` ``*``, a password field, or ``D``, a debug option, the SCRAM keys among them).
SECRET_KEYWORDS: Final = frozenset({
    "password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key",
    "replication", "sslkeylogfile"})
_KEYWORD_START = re.compile(r"\s*([A-Za-z_]+)\s*=")
#: A keyword/value pair of a secret keyword: its value quoted (to the closing quote, or to
#: the end when none) or bare (to the next space).
_SECRET_PAIR = re.compile(
    r"\b(" + "|".join(sorted(SECRET_KEYWORDS)) + r")(\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)",
    re.IGNORECASE)
_PLAIN_HOST = re.compile(r"[A-Za-z0-9._~-]+|[0-9A-Fa-f:.]+")


def is_url(location: object) -> bool:
    """Whether `location` names a PostgreSQL ledger: a ``postgresql://`` URL, or a libpq
    keyword/value string (its first word ``KEYWORD=`` with a keyword libpq knows).
    Anything else is a file path. Decided from the text alone, psycopg or not."""
    if not isinstance(location, str):
        return False
    if "://" in location:
        return location.split("://", 1)[0].lower() in SCHEMES
    start = _KEYWORD_START.match(location)
    return start is not None and start.group(1).lower() in KEYWORDS


def shown_location(location: str | os.PathLike[str]) -> str:
    """`location` as a message, a report or a file may show it: a file path as it is; a
    PostgreSQL URL or keyword/value string without any secret (see the module docstring).
    Never raises."""
    text = os.fspath(location)
    if not is_url(text):
        return text
    is_uri = "://" in text
    parsed = None if is_uri and _ambiguous(text) else _libpq_parse(text)
    if parsed is None:
        return _masked_url(text) if is_uri else _masked_keywords(text)
    values, secret = parsed
    shown = {k: MASK if k in secret else v for k, v in values.items()}
    return _as_url(text.split("://", 1)[0], shown) if is_uri else _as_keywords(shown)


def location_secrets(location: str) -> set[str]:
    """Every text of `location` that may be a secret (for scrubbing a driver's message):
    libpq's secret values, and what the conservative masking hides (the user info after
    its first ``:``, each secret keyword's value), raw and percent-decoded."""
    found: set[str] = set()
    if not is_url(location):
        return found
    parsed = _libpq_parse(location)
    if parsed is not None:
        found.update(parsed[0][k] for k in parsed[1])
    if "://" in location:
        rest = location.split("://", 1)[1]
        info = rest[:rest.rfind("@")] if "@" in rest else ""
        if ":" in info:
            found.add(info.split(":", 1)[1])
        found.update(m.group(3) for m in re.finditer(
            r"[?&]([^=&]*)(=)([^&]*)", rest) if unquote(m.group(1)).lower() in SECRET_KEYWORDS)
    else:
        found.update(_unquoted(m.group(3)) for m in _SECRET_PAIR.finditer(location))
    return {y for x in found for y in (x, unquote(x), quote(x, safe="")) if y}


def without_secrets(text: str, location: str) -> str:
    """`text` (a driver's message about `location`) with `location` shown as
    `shown_location` shows it, and no secret of it left: libpq quotes the token it
    stopped at, which may be the password or hold it."""
    if not is_url(location):
        return text
    text = text.replace(location, shown_location(location))
    for secret in sorted(location_secrets(location), key=len, reverse=True):
        text = re.sub(r'"[^"]*' + re.escape(secret) + r'[^"]*"', f'"{MASK}"', text)
        if len(secret) >= 4:
            text = text.replace(secret, MASK)
    return text


def check_url(location: str) -> None:
    """Refuse (InvalidInput) a URL libpq would read otherwise than it reads: an unencoded
    ``@`` besides the one ending the user info, or a ``/`` before that ``@`` (libpq reads
    the user info up to the first ``@`` or ``/``, so the rest of a password holding one
    becomes the host, the port or the database). Shows the URL masked."""
    if "://" in location and _ambiguous(location):
        raise InvalidInput(
            f"{shown_location(location)} is not a usable PostgreSQL URL: its user name or"
            " password holds an unencoded '@' or '/' (libpq would read part of it as the"
            " host); percent-encode them in the URL ('@' as %40, '/' as %2F) or give the"
            " password as a keyword/value string or in PGPASSWORD")


# -- libpq --------------------------------------------------------------------------------


def _libpq_parse(text: str) -> tuple[dict[str, str], set[str]] | None:
    """libpq's reading of `text`: (keyword -> value, in libpq's order; the keywords whose
    values are secrets), or None if psycopg is not installed or libpq refuses the text."""
    try:
        from psycopg import pq
    except ImportError:
        return None
    try:
        options = pq.Conninfo.parse(text.encode())
    except Exception:  # noqa: BLE001 - libpq refuses it (its message may quote the password)
        return None
    values: dict[str, str] = {}
    secret: set[str] = set()
    for opt in options:
        if opt.val is None:
            continue
        key = opt.keyword.decode()
        values[key] = opt.val.decode(errors="replace")
        if opt.dispchar in (b"*", b"D") or key in SECRET_KEYWORDS:
            secret.add(key)
    return values, secret


def _ambiguous(url: str) -> bool:
    """An ``@`` in `url` other than one ending libpq's user info, or a ``/`` before it."""
    rest = url.split("://", 1)[1]
    at = rest.find("@")
    return at >= 0 and ("/" in rest[:at] or "@" in rest[at + 1:])


def _as_url(scheme: str, values: dict[str, str]) -> str:
    """A libpq URL of `values` (libpq reads it back as them)."""
    v = dict(values)
    user, password = v.pop("user", None), v.pop("password", None)
    host, port, dbname = v.get("host"), v.get("port"), v.pop("dbname", None)
    netloc = ""
    if user is not None:
        netloc = quote(user, safe="*") + (f":{MASK}" if password is not None else "") + "@"
    elif password is not None:
        v = {"password": password, **v}
    hosts = host.split(",") if host is not None else []
    ports = port.split(",") if port is not None else []
    if hosts and all(_PLAIN_HOST.fullmatch(h) for h in hosts) \
            and len(ports) in (0, len(hosts)):
        netloc += ",".join(
            (f"[{h}]" if ":" in h else h) + (f":{ports[i]}" if ports else "")
            for i, h in enumerate(hosts))
        v.pop("host", None)
        v.pop("port", None)
    path = "/" + quote(dbname, safe="") if dbname is not None else ""
    query = "&".join(f"{quote(k, safe='')}={v[k] if v[k] == MASK else quote(v[k], safe='')}"
                     for k in v)
    return f"{scheme}://{netloc}{path}" + (f"?{query}" if query else "")


def _as_keywords(values: dict[str, str]) -> str:
    """A libpq keyword/value string of `values`."""
    def escaped(value: str) -> str:
        if value == MASK:
            return value
        value = value.replace("\\", "\\\\").replace("'", "\\'")
        return f"'{value}'" if not value or re.search(r"\s", value) else value
    return " ".join(f"{k}={escaped(v)}" for k, v in values.items())


# -- conservative masking (no libpq) -------------------------------------------------------


def _masked_url(url: str) -> str:
    """`url` with everything between ``//`` and its last ``@`` hidden, and the value of
    every secret keyword in what follows."""
    scheme, rest = url.split("://", 1)
    at = rest.rfind("@")
    head, tail = (f"{MASK}@", rest[at + 1:]) if at >= 0 else ("", rest)
    tail = re.sub(r"([?&])([^=&]*)=([^&]*)",
                  lambda m: f"{m.group(1)}{m.group(2)}={MASK}"
                  if unquote(m.group(2)).lower() in SECRET_KEYWORDS
                  or unquote(m.group(2)).lower() not in KEYWORDS else m.group(0), tail)
    return f"{scheme}://{head}{tail}"


#: Any keyword/value pair: a keyword libpq does not know may be a secret's, mistyped
#: (``pasword=...``): its value is hidden as a secret's is.
_ANY_PAIR = re.compile(r"\b([A-Za-z_]\w*)(\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)")


def _masked_keywords(text: str) -> str:
    """A keyword/value string with the value of every secret keyword hidden, and of
    every keyword libpq does not know (a secret's, mistyped)."""
    text = _SECRET_PAIR.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    return _ANY_PAIR.sub(lambda m: m.group(0) if m.group(1).lower() in KEYWORDS
                         else f"{m.group(1)}{m.group(2)}{MASK}", text)


def _unquoted(value: str) -> str:
    """A keyword/value string's value as libpq reads it (quotes and escapes removed)."""
    if value.startswith("'"):
        value = value[1:-1] if len(value) > 1 and value.endswith("'") else value[1:]
    return re.sub(r"\\(.)", r"\1", value)


__all__ = ["MASK", "SCHEMES", "check_url", "is_url", "location_secrets", "shown_location",
           "without_secrets"]
