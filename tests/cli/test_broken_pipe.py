"""`ddl ... | head`: when the reader has closed the pipe the command stops quietly (exit 141, as a shell
reports SIGPIPE), not with `error: [Errno 32] Broken pipe`."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_closed_pipe_ends_the_command_quietly():
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line: every write fails
    try:
        out = subprocess.run([sys.executable, "-m", "deep_delta.cli.main", "train", "--list-configs"],
                             stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert out.stderr == "", out.stderr
    assert out.returncode == 141
