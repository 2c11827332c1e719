"""Reading from S3 streams: peak memory and speed of a dump read from an S3 API server against the same file on disk.

    python benchmarks/storage.py --tokens 30M

Starts moto's S3 server on 127.0.0.1 (``pip install "moto[server]"``), uploads the dump, then runs ``rcdiag.analyze``
on the local file and on its ``s3://`` URL, each in a fresh process, and reports peak RSS (``ru_maxrss``) and
throughput. A whole-object download would add the file's size to the S3 run's peak; streaming keeps the two
peaks alike. (moto keeps objects in its own process's memory, so the server's memory is not counted.)
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from _data import dump, parse_tokens

HERE = Path(__file__).resolve().parent
CHILD = """
import resource, sys, time
sys.path.insert(0, {here!r})
from _methods import CONFIG
import rcdiag
start = time.perf_counter()
tokens = rcdiag.analyze({path!r}, CONFIG).input.tokens
print(tokens, time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def run(path: str, env: dict[str, str]) -> tuple[int, float, float]:
    """(tokens, seconds, peak RSS in MB) of ``rcdiag.analyze(path)`` in a fresh process."""
    code = CHILD.format(here=str(HERE), path=path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    tokens, seconds, rss = out.stdout.split()
    return int(tokens), float(seconds), int(rss) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="30M", help="dump size (default 30M)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import boto3

    path = dump(parse_tokens(args.tokens))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    env = os.environ | {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                time.sleep(0.2)
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                              region_name="us-east-1")  # fmt: skip
        client.create_bucket(Bucket="bench")
        client.upload_file(str(path), "bench", path.name)
        print(f"{path.name}: {path.stat().st_size / 1e6:.0f} MB, uploaded to s3://bench/{path.name}")
        sources = {"local": str(path), "s3": f"s3://bench/{path.name}"}
        for round_ in range(args.rounds):
            for name, source in sources.items():
                tokens, seconds, rss = run(source, env)
                print(f"  round {round_ + 1}: {name:6s} {tokens / seconds / 1e6:6.1f} M tok/s, peak RSS {rss:6.0f} MB")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
