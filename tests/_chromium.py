"""Headless Chromium for the report's tests: the rendered DOM, a screenshot, and what the
page asked the network for (a local proxy that every request of the browser goes through,
which answers none and records each)."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from launch_support import wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Nothing a test needs: no network of its own, no first-run work, no profile of the user's.
QUIET = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--no-pings",
    "--disable-features=NetworkTimeServiceQuerying", "--allow-browser-signin=false",
)  # fmt: skip
# What Chromium asks for on its own, whatever the page, even with the flags above (its
# component updater, its sign-in service): exact names, so that a page's CDN (Google's
# fonts.googleapis.com among them) is still seen.
BROWSER_OWN = frozenset({"update.googleapis.com", "accounts.google.com", "clients2.google.com"})
SETTLED = "orch-test: every request before this one is noted"


def chromium(profile: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    argv = [CHROMIUM or "chromium", *QUIET, f"--user-data-dir={profile}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True)


class RequestRecorder:
    """A proxy that records the first line of every request the browser sends it
    (`GET http://cdn.example/x.css HTTP/1.1`, `CONNECT fonts.example:443 HTTP/1.1`) and
    answers none of them."""

    def __init__(self) -> None:
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self.port = self._server.getsockname()[1]
        self.requests: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2.0)
                try:
                    first = conn.recv(4096).split(b"\r\n", 1)[0]
                except OSError:
                    first = b"(no request line)"
                self.requests.append(first.decode("latin-1"))

    @property
    def flags(self) -> tuple[str, ...]:
        # Every request through the proxy, loopback included; names resolved by it alone.
        return (f"--proxy-server=http://127.0.0.1:{self.port}", "--proxy-bypass-list=<-loopback>")

    @property
    def page_requests(self) -> list[str]:
        """The requests that were not the browser's own."""
        return [line for line in self.requests
                if line != SETTLED and _host(line) not in BROWSER_OWN]  # fmt: skip

    def settle(self, timeout: float = 10) -> None:
        """Return once every request sent before this call is noted: the proxy takes its
        connections one at a time, in order, so a request of its own sent now is noted last."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as last:
            last.sendall(f"{SETTLED}\r\n".encode())
        assert wait_for(lambda: SETTLED in self.requests, timeout, 0.01), self.requests

    def close(self) -> None:
        self._server.close()


def _host(request_line: str) -> str:
    """The host a proxy request line names: `CONNECT h:443 ...` or `GET http://h/... ...`."""
    parts = request_line.split()
    target = parts[1] if len(parts) > 1 else ""
    target = target.split("://", 1)[-1]
    return target.split("/", 1)[0].rsplit(":", 1)[0].lower()


@contextmanager
def recording_requests() -> Iterator[RequestRecorder]:
    recorder = RequestRecorder()
    try:
        yield recorder
    finally:
        recorder.close()


def png_pixels(path: Path) -> tuple[int, int, bytes]:
    """A PNG's width, height and its decompressed scanlines."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    idat, offset = b"", 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        if data[offset + 4 : offset + 8] == b"IDAT":
            idat += data[offset + 8 : offset + 8 + length]
        offset += 12 + length
    return width, height, zlib.decompress(idat)


def png_rows(path: Path, upto: int | None = None) -> tuple[int, int, list[bytes]]:
    """A PNG's width, height and its first `upto` rows of pixels (all by default),
    unfiltered, as RGB triples (8 bits a channel, RGB or RGBA, not interlaced: what
    Chromium's screenshots are), so that a test can find where a colour is drawn."""
    width, height, raw = png_pixels(path)
    data = path.read_bytes()
    depth, colour = data[24], data[25]
    assert depth == 8 and colour in (2, 6), f"a PNG of depth {depth}, colour type {colour}"
    step = 3 if colour == 2 else 4
    stride = width * step
    rows: list[bytes] = []
    previous = bytes(stride)
    for y in range(min(height, upto or height)):
        start = y * (stride + 1)
        line = _unfiltered(raw[start], raw[start + 1 : start + 1 + stride], previous, step)
        rows.append(line if step == 3
                    else b"".join(line[i : i + 3] for i in range(0, stride, 4)))  # fmt: skip
        previous = line
    return width, height, rows


def _unfiltered(kind: int, line: bytes, up: bytes, step: int) -> bytes:
    """One scanline with its PNG filter undone (RFC 2083, 6.6)."""
    if kind == 0:
        return line
    if kind == 2:
        return bytes([(a + b) & 0xFF for a, b in zip(line, up, strict=True)])
    out = bytearray(line)
    for i in range(len(out)):
        left = out[i - step] if i >= step else 0
        corner = up[i - step] if i >= step else 0
        out[i] = (out[i] + _predict(kind, left, up[i], corner)) & 0xFF
    return bytes(out)


def _predict(kind: int, left: int, up: int, corner: int) -> int:
    """The filter's prediction of a byte from its neighbours: Sub, Average or Paeth."""
    if kind == 1:
        return left
    if kind == 3:
        return (left + up) // 2
    guess = left + up - corner
    near = min((abs(guess - left), 0), (abs(guess - up), 1), (abs(guess - corner), 2))[1]
    return (left, up, corner)[near]


def colour_at(rows: list[bytes], colour: str) -> list[tuple[int, int]]:
    """Every (x, y) where the pixel is exactly `colour` ("#2b8a3e")."""
    want = bytes.fromhex(colour.removeprefix("#"))
    found = []
    for y, row in enumerate(rows):
        at = row.find(want)
        while at != -1:
            if at % 3 == 0:
                found.append((at // 3, y))
            at = row.find(want, at + 1)
    return found
