"""Sandbox benchmark: upload and download throughput through the real matcher (gunicorn on
loopback, SQLite), and the matcher's CPU per sandbox, for the local store and for S3 (a moto
server on loopback; the bytes go straight to it through presigned URLs).

For each backend, ``--count`` sandboxes of ``--size-kib`` KiB of random (incompressible)
bytes are uploaded as a user would (checksum first, then the bytes), then each is downloaded
and verified. One JSON line per backend and direction on stdout: sandboxes, MB moved, seconds,
MB/s, and the CPU seconds the matcher's processes used, in total and in ms per sandbox. Run
from the repository root::

    .venv/bin/python bench/sandboxes.py --count 50 --size-kib 1024
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import requests
from kit import proc_cpu, upgrade_schema

from gridpilot.devserver import free_port, matcher_server
from matcher.auth import issue_token
from pilot.archive import Member, pack
from taskqueue.core.settings import SandboxSettings
from taskqueue.files.sandboxstore import S3Store

ROOT = Path(__file__).resolve().parents[1]

SECRET = "bench-sandboxes-secret-0123456789"


def matcher_cpu(port: int) -> float:
    """CPU seconds used so far by the processes serving ``port`` (gunicorn and its workers)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if f"127.0.0.1:{port}" not in cmd or "serve" not in cmd:
                continue
        except OSError:
            continue
        total += proc_cpu(int(entry.name)) or 0.0
    return total


def upload(http: requests.Session, base: str, data: bytes) -> str:
    body = {"checksum": hashlib.sha256(data).hexdigest(), "size": len(data)}
    answer = http.post(f"{base}/api/v1/sandboxes", json=body, timeout=60).json()
    if not answer["uploaded"]:
        url = answer["upload"]["url"]
        ours = url.startswith(base)
        put = (http if ours else requests).put(url, data=data,
                                                headers=answer["upload"]["headers"], timeout=60)
        put.raise_for_status()
        if not ours:
            again = http.post(f"{base}/api/v1/sandboxes", json=body, timeout=60).json()
            assert again["uploaded"], again
    return str(answer["sandbox_id"])


def download(http: requests.Session, base: str, sid: str) -> bytes:
    response = http.get(f"{base}/api/v1/sandboxes/{sid}", timeout=60, allow_redirects=False)
    if response.status_code == 307:
        response = requests.get(response.headers["Location"], timeout=60)
    response.raise_for_status()
    return response.content


def run_backend(backend: str, count: int, size: int, work: Path,
                moto: str | None) -> list[dict[str, Any]]:
    url = f"sqlite:///{work / backend / 'bench.db'}"
    (work / backend).mkdir(parents=True)
    upgrade_schema(url)
    env = {"GRIDPILOT_SANDBOXES_BACKEND": backend,
           "GRIDPILOT_SANDBOXES_DIRECTORY": str(work / backend / "store"),
           "GRIDPILOT_SANDBOXES_MAX_UPLOAD_BYTES": str(size + 65536)}
    if moto is not None:
        bucket = f"bench-{uuid.uuid4().hex[:10]}"
        env.update(GRIDPILOT_SANDBOXES_ENDPOINT_URL=moto, GRIDPILOT_SANDBOXES_BUCKET=bucket)
        S3Store(SandboxSettings(backend="s3", endpoint_url=moto, bucket=bucket)).ensure_bucket()
    os.environ.update(env)
    archives = [pack([Member("data.bin", os.urandom(size))]) for _ in range(count)]
    megabytes = sum(len(a) for a in archives) / 1e6
    port = free_port()
    out = []
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", work / backend,
                        port=port) as base:
        http = requests.Session()
        http.headers["Authorization"] = "Bearer " + issue_token(
            SECRET, subject="bench", role="user", vo="lhcb", group="lhcb_user", lifetime=3600)
        ids: list[str] = []
        for direction in ("upload", "download"):
            cpu0, t0 = matcher_cpu(port), time.perf_counter()
            if direction == "upload":
                ids = [upload(http, base, a) for a in archives]
            else:
                for sid, a in zip(ids, archives, strict=True):
                    assert download(http, base, sid) == a
            seconds = time.perf_counter() - t0
            cpu = matcher_cpu(port) - cpu0
            out.append({"measure": f"sandbox_{direction}", "backend": backend,
                        "sandboxes": count, "megabytes": round(megabytes, 3),
                        "seconds": round(seconds, 3), "mb_per_s": round(megabytes / seconds, 2),
                        "matcher_cpu_s": round(cpu, 3),
                        "matcher_cpu_ms_per_sandbox": round(1000 * cpu / count, 2)})
    for key in env:
        os.environ.pop(key, None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--size-kib", type=int, default=1024)
    parser.add_argument("--backends", default="local,s3")
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    with tempfile.TemporaryDirectory(prefix="gp-bench-sandboxes-") as tmp:
        work = Path(tmp)
        moto_port = free_port()
        moto = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H",
                                 "127.0.0.1", "-p", str(moto_port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            endpoint = f"http://127.0.0.1:{moto_port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    requests.get(endpoint, timeout=2)
                    break
                except requests.ConnectionError:
                    if time.monotonic() > deadline:
                        raise SystemExit("moto_server did not start") from None
                    time.sleep(0.1)
            for backend in args.backends.split(","):
                for line in run_backend(backend, args.count, args.size_kib * 1024, work,
                                        endpoint if backend == "s3" else None):
                    print(json.dumps(line), flush=True)
        finally:
            moto.terminate()
            moto.wait(timeout=30)


if __name__ == "__main__":
    main()
