"""Serves the runbooks (docs/runbooks/*.md) as plain text, for the runbook_url of every alert:
the compose stack's `runbooks` service (http://localhost:9480/HiddenIdleSMs.md). Standard library only.

    python3 deploy/serve_runbooks.py DIRECTORY [PORT]
"""
from __future__ import annotations

import functools
import http.server
import sys


class RunbookHandler(http.server.SimpleHTTPRequestHandler):
    # text/markdown makes browsers download the file; as text they show it.
    extensions_map = {".md": "text/plain; charset=utf-8"}

    def log_message(self, *args) -> None:  # a page view is no news
        pass


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or len(args) > 2 or (len(args) == 2 and not args[1].isdigit()):
        print("usage: serve_runbooks.py DIRECTORY [PORT]", file=sys.stderr)
        return 2
    port = int(args[1]) if len(args) == 2 else 8080
    handler = functools.partial(RunbookHandler, directory=args[0])
    with http.server.ThreadingHTTPServer(("", port), handler) as server:
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
