"""The local launcher's fork server ignores SIGTERM and SIGINT.

A signal to the launch's whole process group (`timeout -s TERM`, `kill -TERM -- -PGID`, a
scheduler signalling every process of the job) reaches the fork server too; killed by it,
it would take the ranks' exit statuses with it and the launcher would see every rank fail
mid-stop. Ignoring it, the fork server lives on until the launcher is done (it ends when
its "alive" pipe closes), and the ranks it forks inherit the ignores until they take the
stop signals over or restore the defaults (`ratrain.launch.spawn._child`). (The fork
server sets SIGINT's ignore itself after its preload, but hands its forks the disposition
it found: ignored too, from here.)

Imported as one of the fork server's preload modules (`ratrain.launch.spawn`), and acts
only there: the launcher marks the environment it starts the fork server with
(`FORK_SERVER_MARK`), and this module takes the mark out again so the ranks do not inherit
it. Imported anywhere else, it does nothing.
"""

from __future__ import annotations

import os
import signal

FORK_SERVER_MARK = "RATRAIN_FORK_SERVER"

if os.environ.pop(FORK_SERVER_MARK, None) == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
