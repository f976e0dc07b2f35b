"""A caching HTTP proxy for apt on 127.0.0.1, shared by every root of a test run.

The Ubuntu roots take Canonical's real driver packages from Ubuntu's archive (hundreds of MB per
release). Through this proxy each file of the archive's pool (and each by-hash index) is
downloaded once and kept under .cache/e2e/apt-proxy/, across runs: four hosts cost one download,
and a second run none. Everything else (InRelease, index files by name) is passed through, so apt
always sees the archive's current state and still verifies its signatures itself.

Only plain-HTTP GET/HEAD of absolute URLs (what apt sends to an http proxy); 127.0.0.1 is reached
directly by apt (Acquire::http::Proxy::127.0.0.1 "DIRECT"), never through here.
"""

from __future__ import annotations

import fcntl
import hashlib
import http.server
import os
import shutil
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

# Paths whose content never changes once published: safe to serve from disk forever.
IMMUTABLE = ("/pool/", "/by-hash/")
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade"}


def _cache_path(cache: Path, url: str) -> Path:
    parts = urllib.parse.urlsplit(url)
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return cache / parts.hostname / f"{digest}-{os.path.basename(parts.path)}"


class _Handler(http.server.BaseHTTPRequestHandler):
    cache: Path
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet
        pass

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        url = self.path
        if not url.startswith("http://"):
            self.send_error(400, "absolute http:// URL expected")
            return
        if any(marker in urllib.parse.urlsplit(url).path for marker in IMMUTABLE):
            self._cached(url, head)
        else:
            self._pass_through(url, head)

    def _cached(self, url: str, head: bool) -> None:
        path = _cache_path(self.cache, url)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{path}.lock", "w") as lock:  # one download per file, however many roots ask
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                partial = Path(f"{path}.partial")
                try:
                    with urllib.request.urlopen(url, timeout=120) as response, open(partial, "wb") as out:
                        shutil.copyfileobj(response, out, 1 << 20)
                except urllib.error.HTTPError as exc:
                    self.send_error(exc.code, str(exc.reason))
                    return
                except (urllib.error.URLError, OSError) as exc:
                    self.send_error(502, f"upstream: {exc}")
                    return
                partial.rename(path)
        self.send_response(200)
        self.send_header("Content-Length", str(path.stat().st_size))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if not head:
            with open(path, "rb") as handle:
                shutil.copyfileobj(handle, self.wfile, 1 << 20)

    def _pass_through(self, url: str, head: bool) -> None:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS | {"host"}}
        request = urllib.request.Request(url, headers=headers, method="HEAD" if head else "GET")
        try:
            response = urllib.request.urlopen(request, timeout=60)
        except urllib.error.HTTPError as exc:  # 304 Not Modified and 404 come here
            response = exc
        except (urllib.error.URLError, OSError) as exc:
            self.send_error(502, f"upstream: {exc}")
            return
        with response:
            body = b"" if head else response.read()
            self.send_response(response.status if hasattr(response, "status") else response.code)
            for key, value in response.headers.items():
                if key.lower() not in HOP_HEADERS | {"content-length"}:
                    self.send_header(key, value)
            length = response.headers.get("Content-Length", "0") if head else str(len(body))
            self.send_header("Content-Length", length)
            self.end_headers()
            if body:
                self.wfile.write(body)


class CachingProxy:
    """Started with start(); `url` is what apt's Acquire::http::Proxy takes."""

    def __init__(self, cache: Path) -> None:
        cache.mkdir(parents=True, exist_ok=True)
        handler = type("Handler", (_Handler,), {"cache": cache})
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="apt-proxy")

    def start(self) -> CachingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def apt_config(self) -> str:
        """apt.conf snippet for a root: the archive through the proxy, the loopback stand-ins direct."""
        return (
            "// nodecert e2e: Ubuntu's archive through the run's caching proxy (a site proxy would do\n"
            "// the same); the stand-in repository on 127.0.0.1 directly.\n"
            f'Acquire::http::Proxy "{self.url}";\n'
            'Acquire::http::Proxy::127.0.0.1 "DIRECT";\n'
        )
