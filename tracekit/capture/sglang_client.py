"""Attach to a running SGLang server and capture it through its profile API.

Contract (checked against sglang 0.5.23, see ``docs/sglang_integration.md``):
``GET /model_info`` identifies the server cheaply, ``GET /health`` checks it,
``GET /server_info`` is saved into the run metadata, ``POST /start_profile``
(a ``ProfileReq`` JSON body) starts the profiler on every scheduler rank and
returns *before* any trace exists, ``POST /stop_profile`` stops it; each rank
then writes ``<profile_id>-TP-<r>[...].trace.json.gz`` into ``output_dir``.

The client talks only to the address it is given and uses the standard
library (``urllib``) only.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from tracekit._errors import CaptureError

__all__ = ["DEFAULT_URL", "detect_server"]

DEFAULT_URL = "http://127.0.0.1:30000"


def _http(url: str, path: str, *, method: str = "GET", body: dict[str, Any] | None = None,
          timeout_s: float = 10.0) -> tuple[int, bytes]:
    """One HTTP request; returns (status, body). Raises OSError-family on transport failure."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    # No proxies: capture talks only to the address it was given.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        try:
            payload = e.read()
        except OSError:
            payload = b""
        return e.code, payload


def detect_server(url: str = DEFAULT_URL, timeout_s: float = 0.5) -> bool:
    """True when an SGLang server answers at ``url`` within ``timeout_s``.

    Uses ``GET /model_info`` (``/get_model_info`` on older servers): it answers
    from the HTTP process without a scheduler round trip, unlike ``/health``,
    which in 0.5.23 runs a one-token generation and takes >= 1 s. A JSON
    object with ``model_path`` identifies SGLang. Never raises.
    """
    for path in ("/model_info", "/get_model_info"):
        try:
            status, payload = _http(url, path, timeout_s=timeout_s)
        except (OSError, ValueError):
            return False
        if status == 404:
            continue
        if status != 200:
            return False
        try:
            obj = json.loads(payload)
        except ValueError:
            return False
        return isinstance(obj, dict) and "model_path" in obj
    return False
