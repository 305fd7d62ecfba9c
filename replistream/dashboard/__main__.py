"""``python -m replistream.dashboard --address A --port P [--host H] [--token-file F]``: the
process :func:`replistream.dashboard.launch` starts (``replistream dashboard`` serves the same)."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from .server import cluster_token, serve

    p = argparse.ArgumentParser(prog="python -m replistream.dashboard")
    p.add_argument("--address", required=True, help="the Ray cluster's address")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--token-file", default=None, help="a file holding the token control actions need "
                                                      "(default: the cluster's Ray token, if any)")
    args = p.parse_args(argv)
    token = cluster_token()
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip() or None
    serve(args.address, args.port, host=args.host, token=token,
          on_ready=lambda url: print(f"dashboard: {url} (cluster {args.address}; control actions "
                                     f"{'need the cluster token' if token else 'off: no token'})", flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
