"""The files a box is made of: its environment, sshd_config, /etc/hosts."""

from __future__ import annotations

import posixpath

from sandbox.backend import BoxSpec
from sandbox.boxes.errors import BoxError

BOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PORT_PREFIX = {"runpod": "RUNPOD_TCP_PORT_", "vast": "VAST_TCP_PORT_"}
SANDBOX_DIR = "/run/sandbox"  # the box's read-only view of its sys/ dir
HOOK_LOG = "/var/log/start-hook.log"
# sshd_hang: what a hung login looks like from outside, a session that never runs its command.
# It waits on the session's sshd ($PPID), so it ends with its connection and none pile up.
HUNG_LOGIN = "while kill -0 $PPID 2>/dev/null; do sleep 1; done"


# what the init mounts for the box, where a volume may not go (nor on / itself)
_NO_VOLUME = ("/proc", "/sys", "/dev", "/run", "/etc")


def check_volume(spec: BoxSpec) -> None:
    """A volume has a size and an absolute, normalised path that is no mount of the box's
    own; else `BoxError`."""
    path = spec.volume_path
    if path is None:
        return
    inside = any(path == top or path.startswith(top + "/") for top in _NO_VOLUME)
    if path == "/" or inside or posixpath.normpath(path) != path or not path.startswith("/") \
            or "\0" in path:
        raise BoxError(f"box {spec.box_id}: volume mount path {path!r}: an absolute, "
                       "normalised path outside /proc, /sys, /dev, /run and /etc")
    if spec.volume_gb <= 0:
        raise BoxError(f"box {spec.box_id}: a volume at {path} needs a size")


def box_env(spec: BoxSpec, ports: dict[int, int]) -> dict[str, str]:
    """The container environment: the provider's variables plus one per mapped TCP port."""
    try:
        prefix = PORT_PREFIX[spec.provider]
    except KeyError:
        raise BoxError(f"box {spec.box_id}: unknown provider {spec.provider!r}") from None
    env = {"PATH": BOX_PATH, "HOME": "/root"}
    env.update(spec.env)
    env.update({f"{prefix}{inner}": str(public) for inner, public in ports.items()})
    for key, value in env.items():
        if not key or "=" in key or "\0" in key + value:
            raise BoxError(f"box {spec.box_id}: {key!r} cannot be an environment variable")
    return env


def sshd_config(env: dict[str, str], hung: bool = False) -> str:
    # SSH sessions see the container's environment, as `docker exec` would. sshd honours only
    # the first SetEnv line, so every variable goes on it; a value spanning lines (RunPod's
    # PUBLIC_KEY with several keys) cannot be written in sshd_config and stays in the
    # environment of PID 1 and the start hook only.
    setenv = [f'"{key}={_quote(value)}"' for key, value in sorted(env.items())
              if key.isidentifier() and "\n" not in value and "\r" not in value]
    lines = [
        "# written by the sandbox: one box's sshd, root by key only",
        "Port 22",
        "ListenAddress 0.0.0.0",
        "HostKey /etc/ssh/ssh_host_ed25519_key",  # the box's own, on its disk
        # the account's keys, as the provider injects them; and the box's own file
        f"AuthorizedKeysFile {SANDBOX_DIR}/authorized_keys .ssh/authorized_keys",
        "PermitRootLogin prohibit-password",
        "LogLevel VERBOSE",  # logs each exec'd command: how benchmarks count SSH requests
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        "PrintMotd no",
        "PidFile none",
        "Subsystem sftp internal-sftp",
        "SetEnv " + " ".join(setenv),
    ]
    if hung:  # every session, sftp included, runs this instead of what it asked for
        lines.append(f"ForceCommand {HUNG_LOGIN}")
    return "\n".join(lines) + "\n"


def _quote(value: str) -> str:
    """Escape for a double-quoted sshd_config argument (only \\ and \" are escapes)."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def hosts_file(hostname: str, address: str) -> str:
    return (
        "127.0.0.1\tlocalhost\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        f"{address}\t{hostname}\n"
    )
