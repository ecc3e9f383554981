"""Who may use the console, and proof that a form was sent by the console's own page.

Credentials are one token, from $QUEUEWORKER_CONSOLE_TOKEN or a file (a mounted Kubernetes Secret,
$QUEUEWORKER_CONSOLE_TOKEN_FILE or --token-file). With a token, every page needs it: as a bearer token
(`Authorization: Bearer TOKEN`) or as the password of HTTP basic auth (any user name), which a browser
asks for itself. Without one the console is read-only and open: it refuses to start with
--allow-actions.

Forms (POST only) carry a signed double-submit token: a random value in a SameSite=Strict cookie,
and in the form its HMAC under a key derived from the credentials, so it survives restarts and
holds across replicas. A POST whose Origin (or Referer) names another site is refused before that.

Every request (but the probes' /healthz) must name in its Host header a host the console serves:
a page read through another name is a page read by whoever controls that name, as a DNS
rebinding attack does against a console on localhost.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit

TOKEN_ENV = "QUEUEWORKER_CONSOLE_TOKEN"
TOKEN_FILE_ENV = "QUEUEWORKER_CONSOLE_TOKEN_FILE"
ALLOWED_HOSTS_ENV = "QUEUEWORKER_CONSOLE_ALLOWED_HOSTS"
SECURE_COOKIES_ENV = "QUEUEWORKER_CONSOLE_SECURE_COOKIES"
MIN_TOKEN_LENGTH = 16
MAX_TOKEN_LENGTH = 4096
CSRF_COOKIE = "queueworker_console_csrf"
REALM = 'Basic realm="queueworker console", charset="UTF-8"'


class CredentialsError(ValueError):
    """The token cannot be used; the message says why (never what it is)."""


def load_token(token_file: str | None = None, environ: dict[str, str] | None = None) -> str | None:
    """The console's token: from `token_file`, else $QUEUEWORKER_CONSOLE_TOKEN_FILE, else
    $QUEUEWORKER_CONSOLE_TOKEN; None when none is configured. Surrounding whitespace (a Secret's
    trailing newline) is dropped."""
    environ = os.environ if environ is None else environ
    path = token_file or environ.get(TOKEN_FILE_ENV)
    if path:
        try:
            raw = Path(path).read_bytes()[:MAX_TOKEN_LENGTH + 1]
        except OSError as exc:
            raise CredentialsError(f"cannot read the token file {path!r}: {exc.strerror or exc}") from None
        try:
            token = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise CredentialsError(f"the token file {path!r} is not UTF-8 text") from None
        source = f"the token file {path!r}"
    elif environ.get(TOKEN_ENV) is not None:
        token, source = environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
    else:
        return None
    if not MIN_TOKEN_LENGTH <= len(token) <= MAX_TOKEN_LENGTH:
        raise CredentialsError(f"{source} must hold a token of {MIN_TOKEN_LENGTH} to {MAX_TOKEN_LENGTH} characters")
    if not token.isprintable() or any(c.isspace() for c in token):
        raise CredentialsError(f"{source} must hold a token of printable characters without spaces")
    return token


def authorized(header: str | None, token: str) -> bool:
    """Whether an Authorization header carries the token (bearer, or basic auth's password)."""
    if not header:
        return False
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer":
        given = value
    elif scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        given = decoded.partition(":")[2]
    else:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode("utf-8"))


class CsrfSigner:
    """Signs and checks the double-submit token of the console's forms."""

    def __init__(self, token: str | None):
        # Without credentials no form is ever accepted; a random key still signs the (unused) forms.
        material = token.encode() if token else secrets.token_bytes(32)
        self._key = hmac.new(material, b"queueworker console csrf", hashlib.sha256).digest()

    @staticmethod
    def new_cookie() -> str:
        return secrets.token_urlsafe(32)

    def sign(self, cookie: str) -> str:
        return hmac.new(self._key, cookie.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    def valid(self, cookie: str | None, form_token: object) -> bool:
        if not cookie or not isinstance(form_token, str) or len(cookie) > 200:
            return False
        return hmac.compare_digest(self.sign(cookie).encode(), form_token.encode("utf-8", "surrogatepass"))


def same_origin(origin: str | None, referer: str | None, host: str | None) -> bool:
    """False when the browser says the request came from another site. The Origin header is
    compared with the Host the request was sent to; without it, the Referer's host is."""
    if not host:
        return False
    source = origin if origin else referer
    if source is None:
        return True  # neither header: not a browser's cross-site form (SameSite and the token still apply)
    if source == "null":
        return False
    return urlsplit(source).netloc.lower() == host.lower()


def allowed_hosts(names: tuple[str, ...] = ()) -> frozenset[str]:
    """The host names given with --allowed-host (an ingress's, a Service's), lower case, checked:
    a name without port, scheme or spaces; an IP address is served anyway."""
    hosts = set()
    for given in names:
        name = given.strip().lower().rstrip(".")
        if _address(name) is not None:
            continue
        if not name or any(c.isspace() or c in "/:@[]" for c in name):
            raise ValueError(f"--allowed-host takes a host name, without port or scheme, not {given!r}")
        hosts.add(name)
    return frozenset(hosts)


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def host_name(header: str) -> str:
    """The host of a Host header, lower case, without port or final dot: `[::1]:8080` is `::1`."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    name = header.rpartition(":")[0] if header.count(":") == 1 else header
    return name.rstrip(".")


def served(header: str | None, allowed: frozenset[str]) -> bool:
    """Whether a request's Host header names the console: an IP address (a browser sends one only
    to a page it loaded from that address, so DNS rebinding, which needs a name, cannot), `localhost`,
    or a name given with --allowed-host."""
    if not header:
        return False
    name = host_name(header)
    return name == "localhost" or name in allowed or _address(name) is not None
