"""`<env.python> -m rlvla3.envs.worker FD`: one env's child process under another interpreter.

ProcessVecEnv starts it when `env.python` names an interpreter (a virtual environment whose
simulator packages conflict with ours), with only this source tree on PYTHONPATH and one end of
a socket pair as file descriptor FD. The first message is the run's config and the env's
identity; then it serves the same commands as a spawned child (hosting._worker), over the
numpy-only wire format of envs/wire.py. Only numpy, the stdlib and the env's own simulator are
imported here.
"""
from __future__ import annotations

import sys
from multiprocessing.connection import Connection

from .hosting import _worker
from .wire import WireConnection, namespace


def main(argv: list[str]) -> int:
    conn = WireConnection(Connection(int(argv[0])))
    hello = conn.recv()
    _worker(conn, namespace(hello["cfg"]), hello["env_id"], hello["seed"], hello["auto_reset"], hello["episode"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
