"""Builds processors and reactors into components with the SDK's
`python -m streamhost_guest build` (componentize-py).

    python3 build.py                           every example here, into dist/
    python3 build.py counter                   one of them
    python3 build.py FILE.py [--out-dir DIR]   any module (into DIR, or dist/)
"""

import os
import subprocess
import sys

EXAMPLES = {"counter": "counter", "order-totals": "order_totals", "welcome": "welcome"}

here = os.path.dirname(os.path.abspath(__file__))
# The SDK of this checkout (`pip install ./guest-sdk/python` is for projects
# of their own); componentize-py comes from PyPI.
sdk = os.path.join(here, "..", "..", "guest-sdk", "python")
env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [sdk, os.environ.get("PYTHONPATH")])))

args = sys.argv[1:]
out_dir = os.path.join(here, "dist")
builds = []  # (directory, module, component name)
i = 0
while i < len(args):
    arg = args[i]
    if arg == "--out-dir":
        i += 1
        out_dir = os.path.abspath(args[i])
    elif arg.endswith(".py"):
        path = os.path.abspath(arg)
        module = os.path.basename(path)[:-3]
        builds.append((os.path.dirname(path), module, module.replace("_", "-")))
    elif arg in EXAMPLES:
        builds.append((here, EXAMPLES[arg], arg))
    else:
        sys.exit(f"no example {arg!r}: the examples are {', '.join(EXAMPLES)} (or give a .py file)")
    i += 1
if not builds:
    builds = [(here, module, name) for name, module in EXAMPLES.items()]

os.makedirs(out_dir, exist_ok=True)
for directory, module, name in builds:
    out = os.path.join(out_dir, f"{name}.wasm")
    # Written whole, then renamed: a reader never sees half a component.
    done = subprocess.run(
        [sys.executable, "-m", "streamhost_guest", "build", module, "-p", directory, "-o", out + ".tmp"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        sys.stdout.write(done.stdout)
        sys.exit(f"building {module} failed")
    os.replace(out + ".tmp", out)
    print(done.stdout.strip().splitlines()[-1].replace(out + ".tmp", os.path.relpath(out)))
