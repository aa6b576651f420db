"""The one HTTP POST every push makes: a timeout, and any failure as one line (PushError)."""
from __future__ import annotations

import urllib.error
import urllib.request


class PushError(Exception):
    """A push the receiver did not take, as one line."""


def post(url: str, body: bytes, content_type: str, timeout_s: float) -> bytes:
    """POST with a timeout; the answer's body. Raises PushError (one line)."""
    http = urllib.request.Request(url, data=body, method="POST",
                                  headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(http, timeout=timeout_s) as resp:
            return resp.read()
    except urllib.error.HTTPError as e:
        raise PushError(f"{url.split('?')[0]} answered HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise PushError(f"{url.split('?')[0]} could not be reached: {reason}") from None
