"""`python -m streamhost_guest build APP -o APP.wasm`: builds a component.

Runs componentize-py with the SDK's WIT: the world is `stream-processor`
when APP defines `Processor`, `stream-reactor` when it defines `Reactor`.
`python -m streamhost_guest wit` prints where the SDK's WIT is.
"""

import argparse
import os
import re
import subprocess
import sys
import time

from . import WIT


def world_of(app: str, search: list[str]) -> str:
    for directory in search:
        path = os.path.join(directory, app.replace(".", os.sep) + ".py")
        if os.path.isfile(path):
            text = open(path, encoding="utf-8").read()
            processor = re.search(r"^Processor\s*=", text, re.M) or re.search(r"^class Processor\b", text, re.M)
            reactor = re.search(r"^Reactor\s*=", text, re.M) or re.search(r"^class Reactor\b", text, re.M)
            if processor and reactor:
                sys.exit(f"{path} defines both Processor and Reactor: a Python component exports one; build two")
            if reactor:
                return "stream-reactor"
            if processor:
                return "stream-processor"
            sys.exit(f"{path} defines neither Processor nor Reactor (define_processor or define_reactor)")
    sys.exit(f"no module {app!r} in {', '.join(search)}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m streamhost_guest")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build a component from an app module")
    build.add_argument("app", help="the module that defines Processor or Reactor (e.g. app)")
    build.add_argument("-o", "--output", help="the component to write (default: APP.wasm)")
    build.add_argument("-p", "--path", action="append", default=[], help="where to look for modules (default: .)")
    sub.add_parser("wit", help="print the path of the SDK's WIT")
    args = parser.parse_args()
    if args.command == "wit":
        print(WIT)
        return
    app = args.app[:-3] if args.app.endswith(".py") else args.app
    search = args.path or ["."]
    world = world_of(app, search)
    output = args.output or f"{app.split('.')[-1]}.wasm"
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # componentize-py of this interpreter (its script need not be on PATH).
    componentize_py = "import sys; from componentize_py import script; sys.argv[0] = 'componentize-py'; sys.exit(script())"
    command = [sys.executable, "-c", componentize_py, "-d", WIT, "-w", world, "componentize"]
    for p in [*search, here]:
        command += ["-p", p]
    command += [app, "-o", output]
    try:
        import componentize_py  # noqa: F401
    except ImportError:
        sys.exit("componentize-py is not installed: pip install componentize-py==0.25.1 (or pip install ./guest-sdk/python)")
    started = time.monotonic()
    done = subprocess.run(command)
    if done.returncode != 0:
        sys.exit(done.returncode)
    size = os.path.getsize(output) / 1048576
    print(f"built {output} ({world}, {size:.1f} MiB) in {time.monotonic() - started:.1f} s")


main()
