"""Check that the running Python environment holds exactly the versions of a lock file.

    python scripts/check_lock.py requirements.lock      # exit 1, naming each difference, if any

Every `name==version` line must be installed at that version (local labels such as torch's `+cpu` aside);
distributions installed but not in the lock are listed as a warning (a package of the user's own, say).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: str) -> dict[str, str]:
    pins = {}
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            sys.exit(f"check_lock: {path}: `{line}` is not a `name==version` line")
        pins[canonical(name)] = version.strip()
    return pins


def main(path: str) -> int:
    pins = read_lock(path)
    installed = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions()}
    own = canonical("deep-delta-learning")
    wrong = [
        f"{name}: locked {want}, installed {installed.get(name, 'nothing')}"
        for name, want in sorted(pins.items())
        if installed.get(name, "").split("+")[0] != want
    ]
    extra = sorted(set(installed) - set(pins) - {own})
    if extra:
        print(f"check_lock: installed but not in {path}: {', '.join(extra)}", file=sys.stderr)
    if wrong:
        print(f"check_lock: the environment differs from {path}:\n  " + "\n  ".join(wrong), file=sys.stderr)
        return 1
    print(f"check_lock: {len(pins)} distributions at the locked versions")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/check_lock.py LOCKFILE")
    sys.exit(main(sys.argv[1]))
